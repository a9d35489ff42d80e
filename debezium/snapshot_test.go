package debezium

import (
	"strings"
	"testing"
)

// TestConvertSnapshotMode: snapshot.mode and
// snapshot.select.statement.overrides map onto a commented postgres.backfill
// block (the converted file resumes Debezium's slot, and a backfill needs a
// slot outboxd creates), a note, a warning or an error. Every commented
// block, taken as the comment says (create_slot: true, at_least_once while it
// runs), loads and validates: the converter never suggests a configuration
// outboxd then refuses.
func TestConvertSnapshotMode(t *testing.T) {
	const (
		mode      = "snapshot.mode"
		overrides = "snapshot.select.statement.overrides"
		outbox    = overrides + ".public.outbox"
	)
	for _, tc := range []struct {
		name     string
		settings map[string]string
		err      []string // substrings of the error; none: it converts
		foot     []string // substrings of the comment after the postgres settings
		warn     map[string][]string
		where    string // the commented block's where; "": no block
		orderBy  string
	}{
		{name: "unset is initial", settings: nil, foot: []string{"snapshot.mode initial:", "not sent again", "only when", "create_slot: true"}, where: "true"},
		{name: "initial", settings: map[string]string{mode: "initial"}, foot: []string{"snapshot.mode initial:"}, where: "true"},
		{name: "exported", settings: map[string]string{mode: "exported"}, foot: []string{"snapshot.mode exported (initial):"}, where: "true"},
		{name: "when_needed", settings: map[string]string{mode: "when_needed"}, foot: []string{"snapshot.mode when_needed:", "never snapshots again"},
			warn: map[string][]string{mode: {"is when_needed", "does not send the table's rows again when its slot is lost", "refuses to start"}}, where: "true"},
		{name: "no_data", settings: map[string]string{mode: "no_data"}, foot: []string{"snapshot.mode no_data: no postgres.backfill", "rows already in the table are not sent"}},
		{name: "never", settings: map[string]string{mode: "never"}, foot: []string{"snapshot.mode never: no postgres.backfill"}},
		{name: "schema_only", settings: map[string]string{mode: "schema_only"}, foot: []string{"snapshot.mode schema_only (no_data): no postgres.backfill"}},
		{name: "never ignores overrides", settings: map[string]string{mode: "never", overrides: "public.outbox", outbox: "SELECT id FROM x"},
			foot: []string{"snapshot.mode never"}},
		{name: "always", settings: map[string]string{mode: "always"}, foot: []string{"snapshot.mode always:"},
			warn: map[string][]string{mode: {"is always", "outboxd never does", "outboxd replay"}}, where: "true"},
		{name: "custom", settings: map[string]string{mode: "custom", "snapshot.mode.custom.name": "mine"},
			warn: map[string][]string{mode: {"is custom", "cannot reproduce", "outboxd replay"}}, where: "true"},
		{name: "configuration_based", settings: map[string]string{mode: "configuration_based", "snapshot.mode.configuration.based.snapshot.data": "true"},
			warn: map[string][]string{mode: {"is configuration_based"}}, where: "true"},
		{name: "initial_only", settings: map[string]string{mode: "initial_only"}, err: []string{"snapshot.mode is initial_only", "outboxd always streams", "outboxd replay"}},
		{name: "unknown", settings: map[string]string{mode: "sometimes"}, err: []string{`snapshot.mode "sometimes" is not initial`}},
		{name: "override", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM public.outbox WHERE status IN ('PENDING','PROCESSING')"},
			foot: []string{"snapshot.mode initial:"}, where: "status IN ('PENDING','PROCESSING')"},
		{name: "override, quoted, ordered", settings: map[string]string{overrides: "public.outbox", outbox: `select * from "public"."outbox" where published_at is null order by created_at;`},
			where: "published_at is null", orderBy: "created_at"},
		{name: "override, keywords in a literal (review-bf36 R6)", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM public.outbox WHERE aggregatetype = 'Order' AND type <> 'a;b -- for'"},
			where: "aggregatetype = 'Order' AND type <> 'a;b -- for'"},
		{name: "override without a schema", settings: map[string]string{overrides: "outbox", overrides + ".outbox": "SELECT * FROM outbox"}, where: "true"},
		{name: "override for another table", settings: map[string]string{overrides: "public.orders", overrides + ".public.orders": "SELECT * FROM public.orders WHERE x"},
			warn: map[string][]string{overrides + ".public.orders": {"does not stream"}}, where: "true"},
		{name: "override not listed", settings: map[string]string{outbox: "SELECT * FROM public.outbox WHERE x"},
			warn: map[string][]string{outbox: {"not listed"}}, where: "true"},
		{name: "override listed, no statement", settings: map[string]string{overrides: "public.outbox"},
			err: []string{overrides + ".public.outbox is not set", "postgres.backfill.where by hand"}},
		{name: "override with columns", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT id, payload FROM public.outbox"},
			err: []string{"is not SELECT * FROM public.outbox", "write postgres.backfill.where (and order_by) by hand"}},
		{name: "override of another table's rows", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM archive.outbox WHERE x"},
			err: []string{"reads archive.outbox, not the outbox table public.outbox", "by hand"}},
		{name: "override with a limit", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM public.outbox WHERE a = 1 LIMIT 10"},
			err: []string{`has "LIMIT" in its condition`, "by hand"}},
		{name: "override descending", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM public.outbox ORDER BY id DESC"},
			err: []string{"by hand"}},
		{name: "override with a join", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM public.outbox o JOIN x USING (id)"},
			err: []string{"is not SELECT * FROM"}},
		{name: "override with two statements", settings: map[string]string{overrides: "public.outbox", outbox: "SELECT * FROM public.outbox WHERE true; DROP TABLE x"},
			err: []string{`has ";"`}},
		{name: "exactly once", settings: map[string]string{"exactly.once.support": "required"},
			foot: []string{"set create_slot: true, and:"}, where: "true"}, // a backfill works in exactly_once
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Convert(connector(tc.settings), Options{Brokers: []string{"k:9092"}})
			if len(tc.err) > 0 {
				if err == nil {
					t.Fatalf("converted:\n%s", res.YAML)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out := string(res.YAML)
			foot := strings.ReplaceAll(out, "\n  # ", " ")
			for _, f := range tc.foot {
				if !strings.Contains(foot, f) {
					t.Errorf("no %q in\n%s", f, out)
				}
			}
			got := map[string]string{}
			for _, w := range res.Warnings {
				got[w.Key] += w.Message + "\n"
			}
			for key, subs := range tc.warn {
				for _, sub := range subs {
					if !strings.Contains(got[key], sub) {
						t.Errorf("warning on %s = %q; want one containing %q", key, got[key], sub)
					}
				}
			}
			if tc.warn[mode] == nil && got[mode] != "" {
				t.Errorf("unexpected warning on snapshot.mode: %s", got[mode])
			}
			if cfg := loadBack(t, res.YAML); cfg.Postgres.Backfill.On() || cfg.Postgres.CreateSlot {
				t.Fatalf("the file backfills (%+v) or creates a slot; it must resume Debezium's slot:\n%s", cfg.Postgres.Backfill, out)
			}
			block, ok := backfillBlock(out)
			if ok != (tc.where != "") {
				t.Fatalf("commented backfill block: %v, want %v:\n%s", ok, tc.where != "", out)
			}
			if !ok {
				return
			}
			cfg := loadBack(t, []byte(block))
			if b := cfg.Postgres.Backfill; b.Where != tc.where || b.OrderBy != tc.orderBy {
				t.Errorf("backfill where %q order_by %q, want %q, %q:\n%s", b.Where, b.OrderBy, tc.where, tc.orderBy, block)
			}
		})
	}
}

// backfillBlock returns the converted file with its commented backfill
// block taken as its comment says: uncommented, and create_slot: true.
func backfillBlock(yaml string) (string, bool) {
	var out []string
	in, found := false, false
	for _, l := range strings.Split(yaml, "\n") {
		switch {
		case l == "  # backfill:":
			in, found = true, true
			l = "  backfill:"
		case in && strings.HasPrefix(l, "  #   "):
			l = "  " + l[4:]
		default:
			in = false
		}
		out = append(out, l)
	}
	s := strings.Join(out, "\n")
	s = strings.Replace(s, "create_slot: false", "create_slot: true", 1)
	return s, found
}
