#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine: munged, slurmctld and slurmd, all state under
# one folder. Usage: scripts/slurm/start.sh [STATE_DIR]   (default /tmp/lightning_dist_slurm)
# Prints `export SLURM_CONF=...`; source STATE_DIR/env.sh to use sbatch, srun and squeue.
# Needs root and Debian's slurm-wlm, slurm-client and munge (scripts/slurm/install.sh).
# Stop it with scripts/slurm/stop.sh STATE_DIR.
set -euo pipefail
state=$(realpath -m "${1:-/tmp/lightning_dist_slurm}")
for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
  if ! command -v "$tool" >/dev/null && [ ! -x "/usr/sbin/$tool" ]; then
    echo "error: $tool not found; install Slurm with scripts/slurm/install.sh (Debian: slurm-wlm slurm-client munge)" >&2
    exit 2
  fi
done
if [ "$(id -u)" != 0 ]; then
  echo "error: scripts/slurm/start.sh runs as uid $(id -u); it starts munged and slurmd, so run it as root" >&2
  exit 2
fi
if [ -f "$state/slurmctld.pid" ] && kill -0 "$(cat "$state/slurmctld.pid")" 2>/dev/null; then
  echo "error: a cluster already runs from $state; stop it with scripts/slurm/stop.sh $state" >&2
  exit 2
fi
export PATH="$PATH:/usr/sbin"
rm -rf "$state"
mkdir -p "$state"/{munge,munge-run,ctld,spool,log}
# munged wants its key in a folder only it can read, and its socket in one everyone can enter.
chown munge:munge "$state/munge" "$state/munge-run"
chmod 0700 "$state/munge"
chmod 0755 "$state" "$state/munge-run"
dd if=/dev/urandom of="$state/munge/munge.key" bs=1 count=1024 status=none
chown munge:munge "$state/munge/munge.key"
chmod 0400 "$state/munge/munge.key"
socket="$state/munge-run/munge.socket"
runuser -u munge -- munged --socket="$socket" --key-file="$state/munge/munge.key" \
  --pid-file="$state/munge/munged.pid" --log-file="$state/munge/munged.log" \
  --seed-file="$state/munge/munged.seed"

# Two free TCP ports, so that this cluster never meets another one on the same machine.
read -r ctld_port node_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
node=$(hostname -s)
# SLURM_NODE_CPUS declares more CPUs than the machine has (slurmd is told to believe the
# config), so that several small jobs run side by side; the default is the machine's own count.
cpus=${SLURM_NODE_CPUS:-$(nproc)}
# NVIDIA GPUs, if any, as a GRES, so that --gpus-per-node jobs run (not yet run on a GPU machine).
gpus=$(find /dev -maxdepth 1 -name 'nvidia[0-9]*' | wc -l)
gres=""
: >"$state/gres.conf"
if [ "$gpus" -gt 0 ]; then
  gres="Gres=gpu:$gpus"
  echo "Name=gpu File=/dev/nvidia[0-$((gpus - 1))]" >"$state/gres.conf"
fi
cat >"$state/slurm.conf" <<CONF
# One-node cluster for lightning_dist's tests (scripts/slurm/start.sh); no accounting, no cgroups.
ClusterName=lightning_dist
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
PlugStackConfig=$state/plugstack.conf
${gres:+GresTypes=gpu}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
SchedulerParameters=sched_interval=1
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus $gres State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
: >"$state/plugstack.conf"
echo "export SLURM_CONF=$state/slurm.conf" >"$state/env.sh"
export SLURM_CONF="$state/slurm.conf"
slurmctld -i -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
  if [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.2
done
echo "error: node $node did not become idle in 20 s; see $state/log/slurmctld.log and slurmd.log" >&2
exit 1
