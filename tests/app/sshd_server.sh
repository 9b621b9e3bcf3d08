#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real OpenSSH server on 127.0.0.1 for the remote-run test (issue #36): Debian's sshd, nothing
# faked. Everything lives under STATE (host key, user key, authorized_keys, sshd_config, the
# client's ssh_config and known_hosts, the log and pid file); no system file is touched and no
# service is left behind.
#   sshd_server.sh start STATE   generate the keys, start sshd on a free port, wait until it
#                                answers; the client then uses: ssh -F STATE/ssh_config bltest
#   sshd_server.sh stop STATE    stop it (by its pid file)
# Logs in as the user who runs it (root included: by key only). Needs /usr/sbin/sshd.
set -euo pipefail

cmd=${1:?usage: sshd_server.sh start|stop STATE}
state=${2:?usage: sshd_server.sh start|stop STATE}
mkdir -p "$state"
state=$(cd "$state" && pwd)

if [ "$cmd" = stop ]; then
  if [ -f "$state/sshd.pid" ]; then
    pid=$(cat "$state/sshd.pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: sshd_server.sh start|stop STATE" >&2; exit 2; }
[ -x /usr/sbin/sshd ] || { echo "sshd_server: /usr/sbin/sshd is missing (openssh-server)" >&2; exit 3; }

# sshd refuses keys in group- or world-writable places (StrictModes is off, but keep it tidy).
chmod 700 "$state"
ssh-keygen -q -t ed25519 -N '' -f "$state/host_key" <<< y >/dev/null
ssh-keygen -q -t ed25519 -N '' -f "$state/user_key" <<< y >/dev/null
cp "$state/user_key.pub" "$state/authorized_keys"
chmod 600 "$state/authorized_keys"
# sshd's privilege separation folder (Debian's packaging makes it at boot).
mkdir -p /run/sshd 2>/dev/null || true
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
user=$(id -un)
cat > "$state/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $port
HostKey $state/host_key
PidFile $state/sshd.pid
AuthorizedKeysFile $state/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers $user
StrictModes no
UsePAM no
PrintMotd no
LogLevel VERBOSE
AcceptEnv NONE
CONF
# BL_SSHD_SETENV=NAME=VALUE: set in every session (the Slurm test: SLURM_CONF of its cluster).
if [ -n "${BL_SSHD_SETENV:-}" ]; then
  printf 'SetEnv %s\n' "$BL_SSHD_SETENV" >> "$state/sshd_config"
fi
echo "[127.0.0.1]:$port $(cut -d' ' -f1-2 "$state/host_key.pub")" > "$state/known_hosts"
cat > "$state/ssh_config" <<CONF
Host bltest
  HostName 127.0.0.1
  Port $port
  User $user
  IdentityFile $state/user_key
  IdentitiesOnly yes
  UserKnownHostsFile $state/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
CONF
/usr/sbin/sshd -f "$state/sshd_config" -E "$state/sshd.log"
for _ in $(seq 1 100); do
  if ssh -F "$state/ssh_config" bltest true 2>/dev/null; then
    echo "sshd_server: listening on 127.0.0.1:$port"
    exit 0
  fi
  sleep 0.1
done
echo "sshd_server: sshd did not answer; its log:" >&2
cat "$state/sshd.log" >&2 || true
exit 1
