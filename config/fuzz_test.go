package config_test

import (
	"testing"

	"github.com/outboxd/outboxd/config"
)

// FuzzDecode decodes arbitrary YAML over the defaults and validates the
// result: neither may panic, and a failed Decode must say why.
//
//	go test -run='^$' -fuzz=FuzzDecode -fuzztime=60s ./config
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		"",
		"postgres:\n  dsn: postgres://u:secret@h/db\n  slot: s\n  table: public.outbox\n",
		"kafka:\n  brokers: [a:1, b:2]\n  linger: 5ms\n  topic_partitions: 3\n",
		"router:\n  topic_template: ${routedByValue}-events\n  event_type_column: \"\"\n",
		"http: {listen: ':9090'}\nlog: {level: debug, format: json}\nshutdown_timeout: 3s\n",
		"postgres: [a]\n",
		"kafka:\n  brokers: {a: 1}\n",
		"&a [*a]",
		"a: &x {b: *x}\n",
		"postgres: !!binary aGVsbG8=\n",
		"---\npostgres: {slot: a}\n---\npostgres: {slot: b}\n",
		"postgres:\n  status_interval: 9223372036854775807ns\n",
		"kafka:\n  topic_partitions: 99999999999999999999\n",
		"postgres:\n  tables:\n    - a.outbox\n    - name: b.outbox\n      router: {preset: debezium, key_column: k}\n",
		"postgres:\n  tables:\n    - name: a.outbox\n      router: &r {key_column: k}\n    - name: b.*\n      router: {<<: *r, id_column: i}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := config.Default()
		if err := config.Decode(data, &cfg); err != nil {
			if err.Error() == "" {
				t.Fatalf("Decode(%q) returned an empty error", data)
			}
			return
		}
		_ = cfg.Validate()
		_ = cfg.Redacted()
	})
}
