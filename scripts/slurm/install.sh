#!/usr/bin/env bash
# Install what scripts/slurm/start.sh needs, with apt (Debian: Slurm 22.05 and munge), unless it
# is there already. Installing starts no service (Debian's policy-rc.d); start.sh starts them.
set -euo pipefail
export PATH="$PATH:/usr/sbin"
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
  && command -v sbatch >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "scripts/slurm/install.sh: no apt-get, or not root: Slurm not installed (its tests skip)" >&2
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  slurm-wlm slurm-client munge >/dev/null
