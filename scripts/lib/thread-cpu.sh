# Sourced by the bench scripts: CPU accounting of a process's threads from /proc.

# CPU seconds (user + system) of each thread name of process $1, summed per name, one
# "name seconds" line each, sorted (broker executors are named shardmq-core-N).
thread_cpu() {
  local tick
  tick="$(getconf CLK_TCK)"
  for task in /proc/"$1"/task/*; do
    # comm may hold spaces: take the fields after the closing parenthesis.
    local stat name rest
    stat="$(cat "$task/stat" 2>/dev/null)" || continue
    name="${stat#*(}"; name="${name%%)*}"
    rest="${stat##*) }"
    # rest starts at field 3 (state); utime and stime are fields 14 and 15.
    # shellcheck disable=SC2086
    set -- $rest
    echo "$name ${12} ${13}"
  done | awk -v tick="$tick" '{cpu[$1] += ($2 + $3) / tick} END {for (n in cpu) printf "%s %.3f\n", n, cpu[n]}' | sort
}
