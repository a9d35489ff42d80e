package backfill

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxd/outboxd/internal/replay"
	"github.com/outboxd/outboxd/wal"
)

// TestUnorderedDefault: the backfill warns when order_by is unset and the
// rows go out in the order of a uuid or text primary key, whose values need
// not follow insertion (a Debezium outbox table: id uuid, no created_at),
// and only then (review-bf36 R5).
func TestUnorderedDefault(t *testing.T) {
	source := func(keys, primary []string, cols ...wal.Column) replay.Source {
		return replay.Source{Relation: &wal.Relation{Columns: cols}, Keys: keys, Primary: primary}
	}
	id := func(oid uint32) wal.Column { return wal.Column{Name: "id", TypeOID: oid} }
	created := wal.Column{Name: "created_at", TypeOID: pgtype.TimestamptzOID}
	for _, tc := range []struct {
		name    string
		src     replay.Source
		orderBy string
		want    string
	}{
		{"uuid primary key by default", source([]string{"id"}, []string{"id"}, id(pgtype.UUIDOID)), "", "uuid"},
		{"text primary key by default", source([]string{"id"}, []string{"id"}, id(pgtype.TextOID)), "", "text"},
		{"varchar primary key by default", source([]string{"id"}, []string{"id"}, id(pgtype.VarcharOID)), "", "text"},
		{"bigint primary key by default", source([]string{"id"}, []string{"id"}, id(pgtype.Int8OID)), "", ""},
		{"created_at by default", source([]string{"created_at", "id"}, []string{"id"}, id(pgtype.UUIDOID), created), "", ""},
		{"uuid primary key named", source([]string{"id"}, []string{"id"}, id(pgtype.UUIDOID)), "id", ""},
		{"uuid first of a composite key", source([]string{"id", "n"}, []string{"id", "n"}, id(pgtype.UUIDOID), wal.Column{Name: "n", TypeOID: pgtype.Int4OID}), "", "uuid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unorderedDefault(tc.src, tc.orderBy); got != tc.want {
				t.Errorf("unorderedDefault = %q, want %q", got, tc.want)
			}
		})
	}
}

// The GRANT that lets the role read another schema's state table names
// that schema, a dot in its name included (review-fix55 N6: it was cut out
// of the dotted table name).
func TestUnreadableStateNamesTheSchema(t *testing.T) {
	err := storeIn("app.eu", "outboxd").unreadable("outboxd", errors.New("permission denied"))
	for _, want := range []string{
		`GRANT USAGE ON SCHEMA "app.eu" TO <role>`,
		`GRANT SELECT ON "app.eu"."outboxd_backfill" TO <role>`,
		`key table "app.eu"."outboxd_backfill_outboxd"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %s: %v", want, err)
		}
	}
}
