# shellcheck shell=bash
# Shared helpers for the outboxd test bed scripts; sourced, not executed.
#
# Env: OUTBOXD_TESTBED_DIR (default /tmp/outboxd-testbed) holds all runtime
# state plus the "env" file that the start scripts write.

OUTBOXD_TESTBED_DIR=${OUTBOXD_TESTBED_DIR:-/tmp/outboxd-testbed}
ENV_FILE=$OUTBOXD_TESTBED_DIR/env

die() { echo "$(basename "$0"): error: $*" >&2; exit 1; }
log() { echo "$(basename "$0"): $*" >&2; }

# set_env_var NAME VALUE: replace (or add) "export NAME='VALUE'" in $ENV_FILE,
# keeping every other line, and print the line on stdout.
set_env_var() {
  local name=$1 line="export $1='$2'" tmp
  mkdir -p "$OUTBOXD_TESTBED_DIR"
  tmp=$(mktemp "$ENV_FILE.XXXXXX")
  if [[ -f $ENV_FILE ]]; then grep -v "^export $name=" "$ENV_FILE" >"$tmp" || true; fi
  echo "$line" >>"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" "$ENV_FILE"
  echo "$line"
}

# port_open PORT: true if something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

KAFKA_PID_FILE=$OUTBOXD_TESTBED_DIR/kafka/kafka.pid

# kafka_pid: print the broker pid if the pid file names a live kafka.Kafka process.
kafka_pid() {
  local pid
  pid=$(cat "$KAFKA_PID_FILE" 2>/dev/null) || return 1
  [[ -n $pid ]] && grep -qa 'kafka\.Kafka' "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# wait_gone PID SECONDS: wait up to SECONDS until the process has fully exited
# and released its sockets: reaped, or a zombie with no threads left (its
# cmdline empties earlier than that, so it is not a usable signal).
wait_gone() {
  local i st
  for ((i = 0; i < $2 * 10; i++)); do
    st=$(grep -E '^(State|Threads):' "/proc/$1/status" 2>/dev/null | awk '{printf "%s", $2}') || return 0
    [[ -z $st || $st == Z1 ]] && return 0
    sleep 0.1
  done
  return 1
}
