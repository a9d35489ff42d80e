package shard

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/internal/quote"
)

// MinVersion is the first Postgres major version with publication row
// filters (server_version_num / 10000).
const MinVersion = 15

// Publish is what a shard's publication publishes: inserts only. A row
// filter on a publication that also publishes UPDATE or DELETE requires the
// filter's columns to be in the table's replica identity, and Postgres then
// refuses the application's own UPDATEs and DELETEs of the outbox table
// ("cannot update table ... Column used in the publication WHERE expression
// is not part of the replica identity"). What is given up: outboxd never
// sees an UPDATE of the outbox table, so router.on_update cannot warn.
const Publish = "insert"

// Table is an outbox table of a shard publication, with the key column its
// row filter hashes (its own router.key_column): each table of a shard's
// publication is filtered on its own key, so that every row of every table
// is published to exactly one shard.
type Table struct {
	Schema, Name, KeyColumn string
}

// String returns the table's quoted, schema-qualified name.
func (t Table) String() string { return quote.Ident(t.Schema) + "." + quote.Ident(t.Name) }

// clause returns the table as a publication lists it: its name and, for n
// above 1, Filter's row filter on its key column.
func (t Table) clause(i, n int) string {
	if n == 1 {
		return t.String()
	}
	return t.String() + " WHERE (" + Filter(t.KeyColumn, i, n) + ")"
}

// tableList returns the tables as a publication lists them (clause).
func tableList(tables []Table, i, n int) string {
	parts := make([]string, len(tables))
	for j, t := range tables {
		parts[j] = t.clause(i, n)
	}
	return strings.Join(parts, ", ")
}

// PublicationSQL returns the statement that creates the publication of shard
// i of n: name (from Name) for the tables, publishing inserts only, each
// table with the row filter Filter(its key column, i, n).
// publish_via_partition_root is set as for outboxd's unsharded publication,
// so a partitioned outbox table is published, and filtered, under its own
// name. For n = 1 the statement has no filter. It panics if tables is
// empty, or if i is not in [0, n) or n not in [1, Max].
func PublicationSQL(name string, tables []Table, i, n int) string {
	checkShard(i, n)
	checkTables(tables)
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = '%s', publish_via_partition_root = true)",
		quote.Ident(name), tableList(tables, i, n), Publish)
}

// OptionsSQL returns the statement that gives the existing publication
// name the options PublicationSQL creates a shard's publication with.
func OptionsSQL(name string) string {
	return fmt.Sprintf("ALTER PUBLICATION %s SET (publish = '%s', publish_via_partition_root = true)", quote.Ident(name), Publish)
}

// AddTableSQL returns the statement that adds table t, with its row filter,
// to the existing publication name of shard i of n.
func AddTableSQL(name string, t Table, i, n int) string {
	checkShard(i, n)
	return fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", quote.Ident(name), t.clause(i, n))
}

// AddTablesSQL returns the transaction that adds, to the publication
// pubs[i] of each shard i of len(pubs), the tables missing[i] with their
// row filters: BEGIN; ALTER PUBLICATION ... ADD TABLE ...; ...; COMMIT;
// (one statement alone when only one is needed). Run in one transaction,
// every shard publishes the tables from the same commit on, so a row of
// them is published to exactly one shard, or (written before) to none,
// never to some shards only. It returns "" when nothing is missing.
func AddTablesSQL(pubs []string, missing [][]Table) string {
	lacks := make([]Lack, 0, len(pubs))
	for i, pub := range pubs {
		if i < len(missing) {
			lacks = append(lacks, Lack{Publication: pub, I: i, N: len(pubs), Tables: missing[i]})
		}
	}
	return AddLacksSQL(lacks)
}

// Lack is what the publication Publication of shard I of N lacks: Tables.
type Lack struct {
	Publication string
	I, N        int
	Tables      []Table
}

// AddLacksSQL is AddTablesSQL for publications of any layouts: while a
// reshard is recorded, those of the old shard count and of the new one
// (each table with its row filter for its publication's shard, none for a
// single shard). It panics if a Lack's I is not in [0, N) or N not in
// [1, Max].
func AddLacksSQL(lacks []Lack) string {
	var stmts []string
	for _, l := range lacks {
		if len(l.Tables) > 0 {
			checkShard(l.I, l.N)
			stmts = append(stmts, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", quote.Ident(l.Publication), tableList(l.Tables, l.I, l.N)))
		}
	}
	return TxSQL(stmts)
}

// TxSQL returns stmts as the operator runs them: in one transaction
// (BEGIN; ...; COMMIT;) when there are several, "" when there is none.
func TxSQL(stmts []string) string {
	switch len(stmts) {
	case 0:
		return ""
	case 1:
		return stmts[0]
	}
	return "BEGIN; " + strings.Join(stmts, "; ") + "; COMMIT;"
}

func checkTables(tables []Table) {
	if len(tables) == 0 {
		panic("shard: a publication of no table")
	}
}

// KeyColumnSQL reads what the shard filters need of the key column. Its
// parameters are $1 schema, $2 table and $3 column; it returns one row, to
// scan into KeyColumn.Fields, and KeyColumnError says what it means.
const KeyColumnSQL = `SELECT t.oid IS NOT NULL, a.attnum IS NOT NULL,
	coalesce(format_type(a.atttypid, a.atttypmod), ''),
	coalesce(a.atttypid IN ('text'::regtype, 'varchar'::regtype), false),
	coalesce(quote_ident(n.nspname) || '.' || quote_ident(c.collname), ''),
	coalesce(c.collisdeterministic, true)
FROM (SELECT to_regclass(quote_ident($1::text) || '.' || quote_ident($2::text)) AS oid) t
LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attname = $3::text AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_collation c ON c.oid = a.attcollation
LEFT JOIN pg_namespace n ON n.oid = c.collnamespace`

// KeyColumn is the key column as KeyColumnSQL reads it.
type KeyColumn struct {
	TableExists, Exists bool
	Type                string // as Postgres prints it
	Text                bool   // text or varchar
	Collation           string // schema-qualified and quoted; "" if the type has none
	Deterministic       bool   // the collation's
}

// Fields returns pointers to k's fields in KeyColumnSQL's column order, to
// pass to Scan.
func (k *KeyColumn) Fields() []any {
	return []any{&k.TableExists, &k.Exists, &k.Type, &k.Text, &k.Collation, &k.Deterministic}
}

// KeyColumnError returns why the shard filters cannot key schema.table's
// rows by column, described by k, or nil when they can: it must be a text
// or varchar column of a deterministic collation. A nondeterministic
// collation makes hashtext() hash the collation's sort key, which depends
// on the collation library and which outboxd cannot compute.
func KeyColumnError(k KeyColumn, schema, table, column string) error {
	switch {
	case !k.TableExists:
		return fmt.Errorf("the outbox table %s.%s does not exist; create it, or check postgres.schema and postgres.table", quote.Ident(schema), quote.Ident(table))
	case !k.Exists:
		return fmt.Errorf("the key column %q is not a column of %s.%s; check router.key_column", column, quote.Ident(schema), quote.Ident(table))
	case !k.Text:
		return fmt.Errorf("the key column %q of %s.%s is %s; the shard filters hash it with hashtext(), which outboxd computes only for text and varchar: key by a text or varchar column, or set postgres.shards: 1", column, quote.Ident(schema), quote.Ident(table), k.Type)
	case !k.Deterministic:
		return fmt.Errorf("the key column %q of %s.%s has the nondeterministic collation %s, under which hashtext() hashes a sort key outboxd cannot compute; give the column a deterministic collation (ALTER TABLE ... ALTER COLUMN %s TYPE %s COLLATE \"default\"), or set postgres.shards: 1", column, quote.Ident(schema), quote.Ident(table), k.Collation, quote.Ident(column), k.Type)
	}
	return nil
}

// probeKeys are the keys whose hashtext() VerifyProbe compares with
// Hashtext: every length from 0 to 13 bytes (each way hash_bytes takes the
// last bytes, and one full 12-byte block), two blocks and a tail, and then
// the non-ASCII keys, which also test the database encoding.
var probeKeys = []string{
	"", "a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh",
	"abcdefghi", "abcdefghij", "abcdefghijk", "abcdefghijkl", "abcdefghijklm",
	"order-00000000-0000-4000-8000-000000000000", "outboxd's shard probe",
	"ключ", "日本語のキー", "emoji 🎉",
}

// probeArray is probeKeys as an SQL array (a test checks they agree).
const probeArray = `ARRAY['', 'a', 'ab', 'abc', 'abcd', 'abcde', 'abcdef', 'abcdefg', 'abcdefgh', ` +
	`'abcdefghi', 'abcdefghij', 'abcdefghijk', 'abcdefghijkl', 'abcdefghijklm', ` +
	`'order-00000000-0000-4000-8000-000000000000', 'outboxd''s shard probe', ` +
	`'ключ', '日本語のキー', 'emoji 🎉']`

const (
	probeHead = `SELECT array_agg(hashtext(k COLLATE `
	probeTail = `) ORDER BY o)::int4[] FROM unnest(` + probeArray + `::text[]) WITH ORDINALITY AS u(k, o)`
)

// ProbeSQL is ProbeCollatedSQL for a key column of the database's default
// collation.
const ProbeSQL = probeHead + `pg_catalog."default"` + probeTail

// ProbeCollatedSQL returns the probe run before shards are used: one row,
// one int4[] to pass to VerifyProbe, the hashtext() of fixed keys under
// collation (KeyColumn.Collation, "" for the default). Postgres computes
// every key's shard itself, in the row filters, so delivery is correct
// whatever outboxd computes; but outboxd routes logical messages
// (MessageOwner) with Of, which must agree. It does not on a big-endian
// server, under a nondeterministic collation (KeyColumnError), or, for
// non-ASCII keys, in a database whose encoding is not UTF8: the probe finds
// out. Pass the error of running it to ProbeError.
func ProbeCollatedSQL(collation string) string {
	if collation == "" {
		return ProbeSQL
	}
	return probeHead + collation + probeTail
}

// ProbeError turns the error of running the probe into the error to
// report, or returns nil when err is nil.
func ProbeError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("computing hashtext() of the shard probe keys: %w", err)
}

// VerifyProbe compares the hashes the probe returned with Hashtext's and
// returns an error naming what differs and what to do, or nil when they
// agree.
func VerifyProbe(got []int32) error {
	if len(got) != len(probeKeys) {
		return fmt.Errorf("the shard probe returned %d hashes for %d keys", len(got), len(probeKeys))
	}
	ascii, other := 0, 0
	first := -1
	for i, k := range probeKeys {
		if got[i] == Hashtext([]byte(k)) {
			continue
		}
		if first < 0 {
			first = i
		}
		if isASCII(k) {
			ascii++
		} else {
			other++
		}
	}
	if first < 0 {
		return nil
	}
	k := probeKeys[first]
	what := fmt.Sprintf("Postgres' hashtext() differs from outboxd's for %d of %d probe keys (%q: Postgres %d, outboxd %d)", ascii+other, len(probeKeys), k, got[first], Hashtext([]byte(k)))
	if ascii == 0 {
		return fmt.Errorf("%s, all of them non-ASCII: Postgres hashes a key's bytes in the database encoding and outboxd the UTF-8 it receives, so the database encoding is not UTF8; sharding needs a UTF8 database: set postgres.shards: 1 on this one", what)
	}
	return fmt.Errorf("%s; outboxd computes hashtext() as a little-endian server does, so this server is probably big-endian or its hashtext() is not Postgres' own: set postgres.shards: 1", what)
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// sqlStater is implemented by *pgconn.PgError.
type sqlStater interface{ SQLState() string }

// PublicationError explains an error from running PublicationSQL for
// publication name of the tables, or returns nil when err is nil. It
// recognises what an old server or a wrong key column makes Postgres say;
// other errors are only wrapped with the publication's name.
func PublicationError(err error, name string, tables []Table) error {
	if err == nil {
		return nil
	}
	if len(tables) != 1 {
		return publicationsError(err, name, tables)
	}
	schema, table, column := tables[0].Schema, tables[0].Name, tables[0].KeyColumn
	var s sqlStater
	code := ""
	if errors.As(err, &s) {
		code = s.SQLState()
	}
	switch code {
	case "42601": // syntax_error: no WHERE in CREATE PUBLICATION before 15
		return fmt.Errorf("creating publication %q: %w; sharding needs publication row filters, which came in Postgres %d: upgrade, or set postgres.shards: 1", name, err, MinVersion)
	case "42883": // undefined_function: hashtext(uuid), hashtext(integer), ...
		return fmt.Errorf("creating publication %q: %w; the shard filter hashes %s.%s's key column %q with hashtext(text), so the column must be text or varchar", name, err, schema, table, column)
	case "0A000": // feature_not_supported: "invalid publication WHERE expression"
		return fmt.Errorf("creating publication %q: %w; Postgres refused the shard row filter on %s.%s's key column %q, which must be text or varchar", name, err, schema, table, column)
	case "42703": // undefined_column
		return fmt.Errorf("creating publication %q: %w; the key column %q is not a column of %s.%s", name, err, column, schema, table)
	}
	return fmt.Errorf("creating publication %q: %w", name, err)
}

// publicationsError is PublicationError for several tables: Postgres' error
// names the column or function, not the table, so the hint lists each
// table's key column.
func publicationsError(err error, name string, tables []Table) error {
	keys := make([]string, len(tables))
	for j, t := range tables {
		keys[j] = fmt.Sprintf("%s (%q)", t, t.KeyColumn)
	}
	var s sqlStater
	code := ""
	if errors.As(err, &s) {
		code = s.SQLState()
	}
	switch code {
	case "42601":
		return fmt.Errorf("creating publication %q: %w; sharding needs publication row filters, which came in Postgres %d: upgrade, or set postgres.shards: 1", name, err, MinVersion)
	case "42883", "0A000", "42703":
		return fmt.Errorf("creating publication %q: %w; the shard filters hash each table's key column with hashtext(text), so each must be a text or varchar column of its table: %s",
			name, err, strings.Join(keys, ", "))
	}
	return fmt.Errorf("creating publication %q: %w", name, err)
}

// FilterCheckSQL returns the query that compares the row filter a shard
// publication has, actual (pg_publication_tables.rowfilter, as Postgres
// prints it), with Filter(column, i, n): Postgres evaluates both for a NULL
// key and for 1,000 keys. It returns one row, to scan into
// FilterCheck.Fields. A row filter may only use the table's columns and
// immutable built-in functions and operators (CREATE PUBLICATION refuses
// anything else), so evaluating it outside the publication is safe; one
// that uses another column than the key fails with undefined_column, which
// FilterCheckError explains. It panics if i is not in [0, n) or n not in
// [2, Max].
func FilterCheckSQL(actual, column string, i, n int) string {
	checkShard(i, n)
	if n < 2 {
		panic("shard: a single shard has no row filter")
	}
	differs := `outboxd_a IS DISTINCT FROM outboxd_e`
	return `SELECT coalesce(bool_or(outboxd_k IS NULL AND ` + differs + `), false),
	count(*) FILTER (WHERE outboxd_k IS NOT NULL AND ` + differs + `),
	coalesce(min(outboxd_k) FILTER (WHERE outboxd_k IS NOT NULL AND ` + differs + `), '')
FROM (SELECT outboxd_k, coalesce((` + actual + `), false) AS outboxd_a, coalesce((` + Filter(column, i, n) + `), false) AS outboxd_e
	FROM (SELECT v AS ` + quote.Ident(column) + `, v AS outboxd_k
		FROM (SELECT NULL::text UNION ALL SELECT 'outboxd filter check ' || g FROM generate_series(1, 1000) g) AS keys(v)) AS t) AS c`
}

// FilterCheck is what FilterCheckSQL returns.
type FilterCheck struct {
	NullDiffers bool   // the filter disagrees on a NULL key
	KeysDiffer  int64  // how many of the 1,000 keys it disagrees on
	Example     string // one of them
}

// Fields returns pointers to c's fields in FilterCheckSQL's column order.
func (c *FilterCheck) Fields() []any { return []any{&c.NullDiffers, &c.KeysDiffer, &c.Example} }

// RefilterStatements returns the statements that give the tables of the
// publication name of shard i of n their row filter (Filter on each table's
// key column): each of listed, which the publication lists already, is
// dropped from it and added back with its filter; each of missing is added.
// Run them in one transaction: a transaction of the application commits
// before or after it, so every row is published by the old list or the new
// one. No other table of the publication is touched. It panics if i is not
// in [0, n), n not in [2, Max], or both lists are empty.
func RefilterStatements(name string, listed, missing []Table, i, n int) []string {
	checkShard(i, n)
	if n < 2 {
		panic("shard: a single shard has no row filter")
	}
	checkTables(append(slices.Clone(listed), missing...))
	pub := quote.Ident(name)
	var out []string
	if len(listed) > 0 {
		names := make([]string, len(listed))
		for j, t := range listed {
			names[j] = t.String()
		}
		out = append(out, fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s", pub, strings.Join(names, ", ")))
	}
	return append(out, fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", pub, tableList(append(slices.Clone(listed), missing...), i, n)))
}

// RefilterSQL is RefilterStatements as the operator runs them: in one
// transaction (BEGIN; ...; COMMIT;) when there are two.
func RefilterSQL(name string, listed, missing []Table, i, n int) string {
	return TxSQL(RefilterStatements(name, listed, missing, i, n))
}

// ErrStaleFilter is returned by FilterCheckError for a publication of shard
// 0 whose row filter is outboxd's from before NULL keys had a shard: it
// selects the right keys but publishes a row with a NULL key to no shard.
var ErrStaleFilter = errors.New("the shard row filter publishes rows with a NULL key to no shard")

// FilterCheckError says what the outcome of FilterCheckSQL (c, or err from
// running it) means for table t of publication name of shard i of n: nil
// when its row filter selects exactly shard i's rows of t, an error wrapping
// ErrStaleFilter when it differs only on a NULL key (the caller runs fix,
// the statement that fixes it, or asks for it), and otherwise an error
// naming fix.
func FilterCheckError(c FilterCheck, err error, name string, t Table, fix string, i, n int) error {
	column := t.KeyColumn
	switch {
	case err != nil:
		return fmt.Errorf("checking the row filter of %s in publication %q of shard %d of %d: %w; a shard publication's filter may use only the table's key column %q: give it outboxd's with %s",
			t, name, i, n, err, column, fix)
	case c.KeysDiffer > 0:
		return fmt.Errorf("the row filter of %s in publication %q does not select the rows of shard %d of %d: it disagrees with outboxd's on %d of 1000 test keys (%q), so rows would reach another shard's slot, or none; give it outboxd's filter with %s. Rows it published to the wrong slot before that must be checked by hand",
			t, name, i, n, c.KeysDiffer, c.Example, fix)
	case c.NullDiffers:
		return fmt.Errorf("publication %q of shard %d of %d: %w (column %q of %s is NULL), so outboxd never sees such a row: %s fixes it",
			name, i, n, ErrStaleFilter, column, t, fix)
	}
	return nil
}

// NullKeysSQL returns the query that finds the rows of outbox table t with
// a NULL key, for the operator to check against what reached Kafka.
func NullKeysSQL(t Table) string {
	return fmt.Sprintf("SELECT * FROM %s WHERE %s IS NULL", t, quote.Ident(t.KeyColumn))
}
