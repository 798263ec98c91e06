#!/usr/bin/env bash
# Make a Chorus cluster's secrets for docker/compose.yaml (docs/DOCKER.md, "Secrets"):
#   corosync-authkey        the knet key every node's Corosync encrypts and signs with (256 random bytes)
#   chorus-cluster.crt/.key the certificate and key every coordinator presents and trusts on the
#                           partial-recovery streams (TLS)
#   chorus-cluster.secret   the HMAC secret of the recovery streams' challenge
#   postgres-password       the postgres role's password (SCRAM), set when a node's database is created
# Usage: docker/make-secrets.sh [DIR]   (default: docker/secrets). Existing files are kept, so a
# cluster's key never changes under it; delete the directory to start over. The files are mode
# 0400 in a 0700 directory: readable by their owner only (the container entrypoint, as root,
# copies each to where its process reads it, owned by that process's user).
set -euo pipefail
dir=${1:-$(dirname "$0")/secrets}
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
command -v openssl >/dev/null || { echo "make-secrets: openssl is needed" >&2; exit 1; }

made=()
if [ ! -e "$dir/corosync-authkey" ]; then
  openssl rand -out "$dir/corosync-authkey" 256
  made+=(corosync-authkey)
fi
if [ ! -e "$dir/chorus-cluster.crt" ] || [ ! -e "$dir/chorus-cluster.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj /CN=chorus-cluster -keyout "$dir/chorus-cluster.key" -out "$dir/chorus-cluster.crt" 2>/dev/null
  made+=(chorus-cluster.crt chorus-cluster.key)
fi
if [ ! -e "$dir/chorus-cluster.secret" ]; then
  openssl rand -hex 32 > "$dir/chorus-cluster.secret"
  made+=(chorus-cluster.secret)
fi
if [ ! -e "$dir/postgres-password" ]; then
  openssl rand -base64 24 | tr -d '\n' > "$dir/postgres-password"
  made+=(postgres-password)
fi
chmod 0400 "$dir"/corosync-authkey "$dir"/chorus-cluster.crt "$dir"/chorus-cluster.key \
  "$dir"/chorus-cluster.secret "$dir"/postgres-password
if [ ${#made[@]} -gt 0 ]; then
  echo "make-secrets: made ${made[*]} in $dir"
else
  echo "make-secrets: $dir already holds every secret (kept)"
fi
