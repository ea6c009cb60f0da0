/** The broker API's shapes the panel reads (api/openapi.yaml is the reference). */

export interface IHolder {
  user: string;
  lease_id?: string | null;
  request_id?: string | null;
}

/** Why and since when a GPU or device takes no new grants. */
export interface IDrain {
  reason: string;
  since: string;
}

/** A process using a device although no lease of its owner holds it. */
export interface IOutside {
  user: string;
  pid: number;
  since: string;
  text: string;
}

export interface IDevice {
  uuid: string;
  kind: 'gpu' | 'mig';
  label: string;
  profile: string | null;
  start: number | null;
  memory_mib: number;
  holder: IHolder | null;
  /** How many shares of it are held (absent from older brokers). */
  shares?: number;
  drained: IDrain | null;
  outside?: IOutside[];
  health: string;
  utilization_gpu: number | null;
  memory_used_mib: number | null;
  temperature_c: number | null;
}

export interface IGpu {
  index: number;
  uuid: string;
  name: string;
  model: string;
  memory_mib: number;
  mig_enabled: boolean;
  drained: IDrain | null;
  health: string;
  utilization_gpu: number | null;
  memory_used_mib: number | null;
  temperature_c: number | null;
  /** How it is lent and what holds its shares (absent from older brokers; null: whole only). */
  sharing?: ISharing | null;
  devices: IDevice[];
}

export interface ISharing {
  mode: string;
  shares_now: boolean;
  room_mib: number;
  mechanism: string;
  enforced: boolean;
  /** "shares enforced by MPS". */
  text: string;
  shares: {
    user: string;
    lease_id: string | null;
    memory_mib: number;
    /** Its processes' memory in use and SM utilization (absent from older brokers). */
    used_mib?: number | null;
    utilization?: number | null;
  }[];
}

export interface IQueueEntry {
  position: number;
  eta: string | null;
  eta_range: IEtaRange | null;
  eta_known: boolean;
  /** What the estimate rests on: "history", "time limits", "typical hold", "idle reclaim". */
  eta_basis?: string | null;
  /** The latest start the broker promised, from time limits (null: none). */
  eta_bound?: string | null;
  user: string;
  job_class: string;
  profile?: string;
  gpus?: number;
  min_memory_gb?: number;
  /** Whole GPUs of this model only (a suspended kernel's resume). */
  model?: string;
  submitted_at: string;
  mine: boolean;
  id: string | null;
  holder: string | null;
}

export interface IRequest {
  id: string;
  user: string;
  profile?: string;
  gpus?: number;
  min_memory_gb?: number;
  /** Whole GPUs of this model only (a suspended kernel's resume). */
  model?: string;
  job_class: string;
  holder: string;
  state: string;
  submitted_at: string;
  lease_id: string | null;
  position: number | null;
  /** Where it stands while queued, in the words every front shows (the broker's). */
  place?: string | null;
  /** Why a quota keeps it waiting, naming whose (the broker's words); null if none does. */
  held_back?: string | null;
  eta: string | null;
  eta_range?: IEtaRange | null;
  eta_known: boolean;
  eta_basis?: string | null;
  eta_bound?: string | null;
}

/** An estimate's low and high end (`high` null: no bound). */
export interface IEtaRange {
  low: string;
  high: string | null;
}

export interface ILease {
  id: string;
  request_id: string;
  user: string;
  devices: string[];
  granted_at: string;
  expires_at: string | null;
  state: string;
  profile: string;
  reclaim_at: string | null;
  /** Why it is warned: `time_limit` is kept by Extend; `idle`, `stalled` by use. */
  reclaim_cause?: string | null;
  /** Its time limit in seconds (null: none), with its extensions ending at `ends_at`. */
  limit_s?: number | null;
  ends_at?: string | null;
  extensions?: number;
  /** How long idle reclaim last saw it idle; null where not known. */
  idle_s?: number | null;
  /** Why it ended, in the broker's words (ended leases). */
  reason?: string | null;
  /** What its holder's server does to the kernel once the lease is reclaimed. */
  on_reclaim?: string;
  /** A lease that ended because its kernel was suspended, while the kernel stays so. */
  suspended?: ISuspended | null;
  /** A share of a GPU: what holds it to its memory, in the broker's words. */
  share?: IShare | null;
}

/** A share of a GPU (absent from older brokers, null for whole devices). */
export interface IShare {
  memory_mib: number;
  used_mib: number | null;
  /** Its own processes' SM utilization, percent of the GPU (absent from older brokers;
   * null where NVML gives none). */
  utilization?: number | null;
  gpu: string;
  mechanism: string;
  enforced: boolean;
  /** "8.5 GB of GPU 2, enforced by MPS". */
  text: string;
}

/** A suspended kernel: its GPU memory on the host until its next cell resumes it. */
export interface ISuspended {
  kernel_id: string;
  host_mib: number;
  /** What every front shows, in the broker's words. */
  text: string;
}

export interface IOverview {
  me: { user: string; admin: boolean; kernel_id: string | null };
  gpus: IGpu[];
  queue: IQueueEntry[];
  length: number;
  requests: IRequest[];
  leases: ILease[];
  /** The ended leases of my kernels that stay suspended (absent from older brokers). */
  suspended?: ILease[];
}

/** One message of the event stream: the versioned envelope {v, id, type, at, data}. */
export interface IEnvelope {
  v: number;
  id: number;
  type: string;
  at: string;
  data: any;
}

export interface IPositions {
  /** The whole queue as I may see it (a user's stream; not a kernel token's). */
  queue?: IQueueEntry[];
  queue_length: number;
  requests: IRequest[];
  ahead: Record<string, Record<string, number>>;
}

export interface ISample {
  at: string;
  utilization_gpu: number | null;
}
