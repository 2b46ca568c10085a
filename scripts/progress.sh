# Progress lines for the long steps of the quick start (sourced by
# scripts/setup.sh, build.sh and train-example.sh): a first run on a fresh
# machine must show a line within seconds and never go a minute silent
# (issue #41). test/python/test_first_run_progress.py tests these.
#
#   announce TEXT...          "== [M:SS] TEXT" (time since the script began)
#   with_heartbeat LABEL CMD  runs CMD; while it runs, "   ... LABEL: still
#                             running (Ns)" every MAPP_HEARTBEAT_S (30) s;
#                             returns CMD's status
#   throttle_progress         a filter for ninja's output on a non-terminal:
#                             every line but its "[N/M] ..." progress lines,
#                             and of those the first, the last (N = M) and
#                             one at most every MAPP_PROGRESS_S (10) s

announce() {
  printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"
}

with_heartbeat() {
  local label=$1 start=$SECONDS rc=0 beat
  shift
  (
    # Killed with its sleep, so nothing holds the step's output open after.
    nap=
    trap 'kill $nap 2>/dev/null; exit 0' TERM
    while :; do
      sleep "${MAPP_HEARTBEAT_S:-30}" &
      nap=$!
      wait "$nap"
      printf '   ... %s: still running (%ds)\n' "$label" $((SECONDS - start))
    done
  ) &
  beat=$!
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

throttle_progress() {
  local every=${MAPP_PROGRESS_S:-10} last=-1 line step total
  while IFS= read -r line; do
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      step=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
      if ((last < 0 || SECONDS - last >= every || step == total)); then
        printf '%s\n' "$line"
        last=$SECONDS
      fi
    else
      printf '%s\n' "$line"
    fi
  done
}
