# Jobs of a CI run (sourced by .ci/run and .ci/versions): each job is timed and recorded,
# a failed one does not stop the run, and `report` prints the table of every job's time and
# outcome, then fails when any job failed, naming each. A job started with `background`
# runs beside the others (its output in $CI_LOGS/<name>.log) until `await_job` collects it.

CI_T0=$SECONDS
JOBS=()        # "name|seconds|outcome", in the order they ended
declare -A BG  # background job -> its pid

record() {  # NAME SECONDS STATUS
    local outcome=passed
    [ "$3" = 0 ] || outcome="FAILED (exit $3)"
    JOBS+=("$1|$2|$outcome")
    echo "=== $1: $outcome in $2 s"
}

job() {  # NAME COMMAND...: run it now
    local name=$1 t0=$SECONDS status
    shift
    echo "=== $name"
    "$@"
    status=$?
    record "$name" $((SECONDS - t0)) $status
    return $status
}

background() {  # NAME COMMAND...: start it beside what follows
    local name=$1
    shift
    : "${CI_LOGS:?the directory of the background jobs output}"
    echo "=== $name (beside the next jobs; its output: $CI_LOGS/$name.log)"
    (
        t0=$SECONDS
        "$@" >"$CI_LOGS/$name.log" 2>&1
        echo "$? $((SECONDS - t0))" >"$CI_LOGS/$name.status.new"
        mv "$CI_LOGS/$name.status.new" "$CI_LOGS/$name.status"  # whole, for who waits on it
    ) &
    BG[$name]=$!
}

await_job() {  # NAME: wait for a background job, show its output's end, record it
    local name=$1 status seconds
    wait "${BG[$name]}"
    read -r status seconds <"$CI_LOGS/$name.status" || status=1
    # its end: the summary where it passed, enough to find the failure where it did not
    tail -n "$([ "$status" = 0 ] && echo 15 || echo 150)" "$CI_LOGS/$name.log" | sed "s/^/    $name: /"
    record "$name" "${seconds:-0}" "$status"
    return "$status"
}

report() {  # the table; exit 1 when a job failed
    local row name seconds outcome failed=()
    printf '\n=== CI: %d jobs in %d s (%d min)\n' ${#JOBS[@]} $((SECONDS - CI_T0)) $(((SECONDS - CI_T0 + 59) / 60))
    printf '%-44s %7s  %s\n' job seconds outcome
    for row in "${JOBS[@]}"; do
        IFS='|' read -r name seconds outcome <<<"$row"
        printf '%-44s %7d  %s\n' "$name" "$seconds" "$outcome"
        [ "$outcome" = passed ] || failed+=("$name")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        printf '=== CI FAILED: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')"
        return 1
    fi
    echo "=== CI passed"
}

pyenv_python() {  # the newest pyenv CPython matching $1 (3.10.*, 3.[0-9]*), else $2 on PATH
    local p
    p=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$1 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$p" ]; then echo "$p/bin/python"; else command -v "$2"; fi
}
