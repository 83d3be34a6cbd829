#!/usr/bin/env bash
# Stop the cluster that scripts/slurm/start.sh STATE_DIR started: slurmctld, slurmd, munged.
# Usage: scripts/slurm/stop.sh [STATE_DIR]   (default /tmp/lightning_dist_slurm)
set -uo pipefail
state=$(realpath -m "${1:-/tmp/lightning_dist_slurm}")
export PATH="$PATH:/usr/sbin" SLURM_CONF="$state/slurm.conf"
if [ -f "$SLURM_CONF" ]; then
  # Jobs first: their slurmstepd processes outlive the daemons otherwise.
  scancel --quiet --full --user="$(id -un)" 2>/dev/null
  for _ in $(seq 100); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && ! pgrep -x slurmstepd >/dev/null && break
    sleep 0.2
  done
  scontrol shutdown >/dev/null 2>&1
fi
# Whatever did not go with `scontrol shutdown` (a daemon that never answered) goes by its pid file.
for pidfile in "$state/slurmctld.pid" "$state/slurmd.pid" "$state/munge/munged.pid"; do
  pid=$(cat "$pidfile" 2>/dev/null) || continue
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    [ "$pidfile" = "$state/munge/munged.pid" ] && kill "$pid" 2>/dev/null
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
done
exit 0
