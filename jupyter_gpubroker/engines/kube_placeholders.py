"""Placeholder pods: GPUs kept warm on Kubernetes ahead of the forecast, as
cluster-autoscaler's overprovisioning recipe keeps spare capacity (its FAQ, "How can I
configure overprovisioning with Cluster Autoscaler?"): pause pods of a PriorityClass below
0 ask for the resources. Its value is -10, "the lowest priority that triggers scaling
clusters"; "other pods need to use priority 0 or higher in order to be able to preempt"
them. Where GPUs are free, a placeholder keeps one, so the autoscaler does not take its
node away; where none is, it waits at the scheduler, and that is what makes the autoscaler
add a node. A GPU server's pod (priority 0) that needs the GPU preempts it, so a
placeholder never keeps a grant waiting; the inventory counts its GPU free to the broker's
grants (``kubernetes.is_placeholder``).

How many and when, the running broker decides (``runtime.kube_ahead``). This module is the
mechanism: list, make and delete the pods in ``placeholder_namespace``, and make their
PriorityClass when it is missing. Each pod asks for one ``nvidia.com/gpu``, the device
plugin's whole GPU (MIG resources and DRA claims are not kept warm)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..inventory import CapacityRefused, Warm, WarmCapacity
from .kubernetes import ENDED_PHASES, GPU_RESOURCE, PLACEHOLDER_LABEL, pod_gpu_requests

if TYPE_CHECKING:
    from .kubernetes import KubernetesInventory

PRIORITY = -10
"""The PriorityClass the broker makes: the recipe's."""
SINCE = "gpubroker.jupyter.org/since"
"""The annotation with the broker's clock when it made the pod (its GPU-hours count from)."""
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PODS_HINT = (
    "grant the broker's service account create and delete on pods in namespace {ns} "
    "(the Role gpubroker-placeholders in docs/kubernetes.md)"
)
CLASS_HINT = (
    "grant the broker's service account get and create on priorityclasses in "
    "scheduling.k8s.io (the ClusterRole gpubroker-placeholders in docs/kubernetes.md)"
)


def priority_class(name: str) -> dict[str, Any]:
    """The PriorityClass the broker makes when it is missing."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {PLACEHOLDER_LABEL: "class"}},
        "value": PRIORITY,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": "GPUs kept warm ahead of the GPU broker's forecast: any pod of priority "
        "0 or more preempts these placeholders.",
    }


def placeholder_pod(source: KubernetesInventory, namespace: str, now: float) -> dict[str, Any]:
    """One placeholder: a pause container asking for one whole GPU, preempted by anything
    of priority 0 or more and gone at once (no grace period), as the recipe's are."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "gpubroker-placeholder-",
            "namespace": namespace,
            "labels": {PLACEHOLDER_LABEL: source.broker_name},
            "annotations": {SINCE: repr(now)},
        },
        "spec": {
            "priorityClassName": source.placeholder_priority_class,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "nodeSelector": dict(source.placeholder_node_selector),
            "tolerations": list(source.placeholder_tolerations),
            "containers": [
                {
                    "name": "placeholder",
                    "image": source.placeholder_image,
                    "resources": {"limits": {GPU_RESOURCE: "1"}, "requests": {"cpu": "1m"}},
                }
            ],
        },
    }


def _warm(pod: Any) -> Warm:
    annotations = pod.metadata.annotations or {}
    try:
        since = float(annotations[SINCE])
    except (KeyError, ValueError):
        since = pod.metadata.creation_timestamp.timestamp()
    return Warm(
        f"{pod.metadata.namespace}/{pod.metadata.name}",
        pod_gpu_requests(pod)[GPU_RESOURCE],
        since,
        pod.spec.node_name or None,
    )


def _message(error: Any) -> str:
    """What the API server said in its Status, else its HTTP reason."""
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.reason)


class Placeholders(WarmCapacity):
    """The placeholder pods of one broker (``source.broker_name``)."""

    what = "placeholder pods"

    def __init__(self, source: KubernetesInventory) -> None:
        self.source = source
        self._class_checked = False

    @property
    def namespace(self) -> str:
        """``placeholder_namespace``, else the broker's own in the cluster, else default."""
        if self.source.placeholder_namespace:
            return self.source.placeholder_namespace
        try:
            return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"

    @contextlib.asynccontextmanager
    async def _api(self) -> AsyncIterator[Any]:
        """A client of its own for one call's event loop, errors said in a sentence."""
        from aiohttp import ClientError
        from kubernetes_asyncio.client import ApiClient

        configuration = await self.source.configured()
        try:
            async with ApiClient(configuration) as api:
                yield api
        except (ClientError, OSError, asyncio.TimeoutError) as e:
            raise CapacityRefused(
                f"the Kubernetes API server at {configuration.host} does not answer "
                f"({e or type(e).__name__})"
            ) from None

    def _refused(self, error: Any, doing: str, hint: str) -> CapacityRefused:
        said = _message(error)
        if error.status == 401 or error.status == 403 and "cannot" in said:  # RBAC's
            why = hint.format(ns=self.namespace)
        elif error.status == 404 and doing.startswith("create pods"):
            why = f"namespace {self.namespace} does not exist: create it, or set "
            why += "c.KubernetesInventory.placeholder_namespace"
        else:
            why = said
        return CapacityRefused(
            f"the Kubernetes API server refused to {doing} ({error.status} {error.reason}): {why}"
        )

    async def check(self) -> None:
        """The PriorityClass fit (made if missing), and RBAC's leave to make and delete
        the pods, asked of the API server itself (a SelfSubjectAccessReview each), so that
        no placeholder is made that the broker could not delete."""
        from kubernetes_asyncio.client import ApiException, AuthorizationV1Api

        async with self._api() as api:
            await self._check_class(api)
            for verb in ("create", "delete"):
                review: Any = {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {
                        "resourceAttributes": {
                            "namespace": self.namespace,
                            "verb": verb,
                            "resource": "pods",
                        }
                    },
                }
                try:
                    answer = await AuthorizationV1Api(api).create_self_subject_access_review(
                        review, _request_timeout=self.source.request_timeout
                    )
                except ApiException as e:
                    raise self._refused(e, "review its RBAC", PODS_HINT) from None
                if not answer.status.allowed:
                    raise CapacityRefused(
                        f"RBAC does not let the broker {verb} pods in namespace "
                        f"{self.namespace}: {PODS_HINT.format(ns=self.namespace)}"
                    )

    async def kept(self) -> list[Warm]:
        from kubernetes_asyncio.client import ApiException, CoreV1Api

        selector = f"{PLACEHOLDER_LABEL}={self.source.broker_name}"
        async with self._api() as api:
            try:
                # a consistent read, not the watch cache: a pod just made is never missed
                pods = await CoreV1Api(api).list_namespaced_pod(
                    self.namespace,
                    label_selector=selector,
                    _request_timeout=self.source.request_timeout,
                )
            except ApiException as e:
                doing = f"list pods in namespace {self.namespace}"
                raise self._refused(e, doing, PODS_HINT) from None
        return [
            _warm(p)
            for p in pods.items
            if p.metadata.deletion_timestamp is None
            and (p.status is None or p.status.phase not in ENDED_PHASES)
        ]

    async def add(self, now: float) -> Warm:
        from kubernetes_asyncio.client import ApiException, CoreV1Api

        async with self._api() as api:
            await self._check_class(api)
            body: Any = placeholder_pod(self.source, self.namespace, now)  # the client takes dicts
            try:
                pod = await CoreV1Api(api).create_namespaced_pod(
                    self.namespace, body, _request_timeout=self.source.request_timeout
                )
            except ApiException as e:
                self._class_checked = False  # it may have been deleted meanwhile
                doing = f"create pods in namespace {self.namespace}"
                raise self._refused(e, doing, PODS_HINT) from None
        return _warm(pod)

    async def remove(self, name: str) -> None:
        from kubernetes_asyncio.client import ApiException, CoreV1Api

        namespace, _, pod = name.partition("/")
        async with self._api() as api:
            try:
                await CoreV1Api(api).delete_namespaced_pod(
                    pod,
                    namespace,
                    grace_period_seconds=0,
                    _request_timeout=self.source.request_timeout,
                )
            except ApiException as e:
                if e.status != 404:  # gone already: preempted, or deleted by someone
                    doing = f"delete pods in namespace {namespace}"
                    raise self._refused(e, doing, PODS_HINT) from None

    async def _check_class(self, api: Any) -> None:
        """The PriorityClass exists, made now if it is missing, and is below 0."""
        from kubernetes_asyncio.client import ApiException, SchedulingV1Api

        if self._class_checked:
            return
        scheduling = SchedulingV1Api(api)
        name = self.source.placeholder_priority_class
        timeout = self.source.request_timeout
        try:
            found = await scheduling.read_priority_class(name, _request_timeout=timeout)
        except ApiException as e:
            if e.status != 404:
                raise self._refused(e, f"get PriorityClass {name}", CLASS_HINT) from None
            made: Any = priority_class(name)
            try:
                found = await scheduling.create_priority_class(made, _request_timeout=timeout)
            except ApiException as e:
                raise self._refused(e, f"create PriorityClass {name}", CLASS_HINT) from None
        if found.value >= 0:
            raise CapacityRefused(
                f"PriorityClass {name} has priority {found.value}, so GPU servers (priority 0 "
                "unless set) would not preempt its placeholder pods: give them a class below 0 "
                f"(cluster-autoscaler's recipe uses {PRIORITY})"
            )
        self._class_checked = True
