# Shared by bench/drain-profile and bench/drain-ab (source it): the same fill
# for both, so that their figures compare.

# fill DSN N TX SIZE writes N outbox events of about SIZE bytes, in
# transactions of TX rows, over 10 aggregate types and 1,000 aggregate ids.
# With DELETE=1 each transaction deletes its rows again before it commits
# (insert-then-delete, as migrations/0001_outbox.sql describes).
fill() {
  local dsn=$1 n=$2 tx=$3 size=$4
  local md5s=$((size / 32 + 1)) del=""
  [ "${DELETE:-0}" = 1 ] && del="DELETE FROM outbox;"
  psql -q "$dsn" >/dev/null <<SQL
DO \$\$ BEGIN FOR t IN 1..$((n / tx)) LOOP
  INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
  SELECT 'exp_fixed_t' || (i % 10), 'a' || (i % 1000), 'E',
    jsonb_build_object('pad', substr((SELECT string_agg(md5(t || '.' || i || '.' || k), '') FROM generate_series(1, $md5s) k), 1, $((size - 30))))
  FROM generate_series(1, $tx) i; $del COMMIT; END LOOP; END \$\$;
SQL
}

# produced ADDR prints how many records the outboxd serving metrics on ADDR
# has produced (0 while it does not answer yet).
produced() {
  curl -s "$1/metrics" 2>/dev/null | awk '/^outboxd_sink_records_produced_total/{s+=$2} END{print s+0}'
}
