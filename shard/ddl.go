package shard

import (
	"errors"
	"fmt"
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

// PublicationSQL returns the statement that creates the publication of shard
// i of n: name (from Name) for schema.table, publishing inserts only, with
// the row filter Filter(column, i, n). publish_via_partition_root is set as
// for outboxd's unsharded publication, so a partitioned outbox table is
// published, and filtered, under its own name. For n = 1 the statement has
// no filter. It panics if i is not in [0, n) or n not in [1, Max].
func PublicationSQL(name, schema, table, column string, i, n int) string {
	checkShard(i, n)
	where := ""
	if n > 1 {
		where = " WHERE (" + Filter(column, i, n) + ")"
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s.%s%s WITH (publish = '%s', publish_via_partition_root = true)",
		quoteIdent(name), quoteIdent(schema), quoteIdent(table), where, Publish)
}

// ProbeSQL is run once before the shard publications are created. The row
// filters call md5(), which Postgres evaluates only while decoding (never
// in the application's INSERT), so a server that refuses MD5, as one whose
// OpenSSL is in FIPS mode does, would accept the publications and fail
// later, in every walsender. The probe makes that an error at creation;
// pass its error to ProbeError.
const ProbeSQL = `SELECT md5('outboxd')`

// ProbeError turns ProbeSQL's error into the error to report, or returns nil
// when err is nil.
func ProbeError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("this Postgres server cannot compute md5() (%w), which the shard row filters need; a server in FIPS mode refuses MD5: run outboxd with postgres.shards: 1 on it", err)
}

// sqlStater is implemented by *pgconn.PgError.
type sqlStater interface{ SQLState() string }

// PublicationError explains an error from running PublicationSQL for a
// publication on schema.table with key column column, or returns nil when
// err is nil. It recognises what an old server or a wrong key column makes
// Postgres say; other errors are only wrapped with the publication's name.
func PublicationError(err error, name, schema, table, column string) error {
	if err == nil {
		return nil
	}
	var s sqlStater
	code := ""
	if errors.As(err, &s) {
		code = s.SQLState()
	}
	switch code {
	case "42601": // syntax_error: no WHERE in CREATE PUBLICATION before 15
		return fmt.Errorf("creating publication %q: %w; sharding needs publication row filters, which came in Postgres %d: upgrade, or set postgres.shards: 1", name, err, MinVersion)
	case "42883": // undefined_function: md5(uuid), md5(integer), ...
		return fmt.Errorf("creating publication %q: %w; the shard filter hashes %s.%s's key column %q with md5(text), so the column must be text or varchar", name, err, schema, table, column)
	case "0A000": // feature_not_supported: "invalid publication WHERE expression"
		return fmt.Errorf("creating publication %q: %w; Postgres refused the shard row filter on %s.%s's key column %q, which must be text or varchar", name, err, schema, table, column)
	case "42703": // undefined_column
		return fmt.Errorf("creating publication %q: %w; the key column %q is not a column of %s.%s", name, err, column, schema, table)
	}
	return fmt.Errorf("creating publication %q: %w", name, err)
}
