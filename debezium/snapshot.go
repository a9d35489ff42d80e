package debezium

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// snapshot maps snapshot.mode and snapshot.select.statement.overrides onto
// postgres.backfill, as a comment after the postgres settings: the converted
// configuration resumes Debezium's slot (create_slot: false), whose initial
// snapshot Debezium sent when the connector first started, and a backfill
// needs a slot outboxd creates. The comment is the block for a deployment
// that has no slot yet. Modes outboxd cannot reproduce are warned about or
// refused.
func (v *conv) snapshot(pg *section, kafka section) error {
	raw, set := v.get("snapshot.mode")
	mode := strings.ToLower(raw)
	if !set {
		mode = "initial" // Debezium's default
	}
	table, _ := pg.value("table").(string)
	label := "snapshot.mode " + mode
	if alias, ok := map[string]string{"exported": "initial", "schema_only": "no_data"}[mode]; ok {
		label += " (" + alias + ")"
		mode = alias
	}
	var what string
	switch mode {
	case "initial":
		what = "Debezium sent the rows already in the table once, when the connector first started\n" +
			"(no offsets yet); outboxd resumes its slot, so they are not sent again."
	case "when_needed":
		what = "Debezium sent the rows already in the table when it had no offsets or its offsets\n" +
			"pointed at WAL no longer there; outboxd resumes its slot, so they are not sent again, and it\n" +
			"never snapshots again: a lost or invalidated slot stops it with an error instead."
		v.warn("snapshot.mode", "is when_needed: outboxd does not send the table's rows again when its slot is lost or invalidated; "+
			"it refuses to start instead. To start over, drop the slot and start outboxd with create_slot: true and postgres.backfill "+
			"(the commented block in the file), which sends the rows already in the table once, before streaming")
	case "no_data", "never":
		v.consumePrefix("snapshot.select.statement.overrides")
		pg.foot = label + ": no postgres.backfill; as with Debezium, rows already in the table\n" +
			"are not sent, only what commits after the slot's position."
		return nil
	case "always":
		v.warn("snapshot.mode", "is always: Debezium sent every row in the table again at each start; outboxd never does (a restart resumes at the slot's confirmed position). "+
			"Send rows still in the table again on purpose with outboxd replay -where ...; the commented postgres.backfill block sends them once, for a new slot")
		what = "Debezium sent the rows already in the table at each start; outboxd does not."
	case "initial_only":
		return fmt.Errorf("snapshot.mode is initial_only: Debezium sent the rows in the table once and stopped without streaming; outboxd always streams. " +
			"To send the rows still in the table once, use outboxd replay -table TABLE -where CONDITION beside (or without) a running outboxd; " +
			"remove snapshot.mode (or set it to no_data) to convert the connector for streaming")
	case "custom", "configuration_based":
		v.consumePrefix("snapshot.mode.")
		v.warn("snapshot.mode", "is %s: outboxd cannot reproduce a snapshotter's own decisions; the file resumes Debezium's slot and sends no rows already in the table. "+
			"For a new slot, set create_slot: true and postgres.backfill (the commented block in the file) to send them once, before streaming; "+
			"to send rows again beside a running outboxd, use outboxd replay", mode)
		what = "Debezium's " + mode + " snapshotter decided which rows it sent;\noutboxd sends no rows already in the table on this slot."
	default:
		return fmt.Errorf("snapshot.mode %q is not initial, when_needed, no_data, never, always, initial_only, custom or configuration_based", raw)
	}
	if v.several {
		// config refuses postgres.backfill with several postgres.tables, so
		// the file gets no block it would refuse.
		if _, set := v.get("snapshot.select.statement.overrides"); set {
			v.warn("snapshot.select.statement.overrides", "is not mapped: postgres.backfill is not supported with several postgres.tables yet")
		}
		v.consumePrefix("snapshot.select.statement.overrides")
		pg.foot = label + ": " + what + "\n" +
			"postgres.backfill is not supported with several postgres.tables yet: to send the rows already\n" +
			"in a table once, backfill it with an outboxd of its own (postgres.table), or use outboxd replay -table."
		return nil
	}
	where, orderBy, err := v.overrides(table)
	if err != nil {
		return err
	}
	b := []string{
		label + ": " + what,
		"outboxd sends the rows already in the table once, before streaming, only when it creates",
		"the slot (docs/backfill.md). For a new deployment with no slot yet, set create_slot: true,",
	}
	b[len(b)-1] += " and:"
	b = append(b, "backfill:", "  where: "+strconv.Quote(where)+" # "+whereFrom(where))
	if orderBy != "" {
		b = append(b, "  order_by: "+orderBy+" # the override's ORDER BY")
	} else {
		b = append(b, "  # order_by: a column that grows in insertion order; without it, created_at if the table has one,",
			"  # else the primary key, which with uuid ids (Debezium's outbox table) reorders each aggregate's events")
	}
	pg.foot = strings.Join(b, "\n")
	return nil
}

func whereFrom(where string) string {
	if where == "true" {
		return "every row, as Debezium's snapshot sent"
	}
	return "snapshot.select.statement.overrides"
}

// overrides reads snapshot.select.statement.overrides for the outbox table:
// the rows its SELECT returns become the backfill's where (and order_by).
// It returns "true", "" when there is none.
func (v *conv) overrides(table string) (where, orderBy string, err error) {
	const key = "snapshot.select.statement.overrides"
	list, _ := v.get(key)
	var listed []string
	for _, t := range strings.Split(list, ",") {
		if t = strings.TrimSpace(t); t != "" {
			listed = append(listed, t)
		}
	}
	where = "true"
	for k := range v.cfg {
		if strings.HasPrefix(k, key+".") {
			v.used[k] = true
		}
	}
	found := false
	for _, t := range listed {
		stmt, ok := v.get(key + "." + t)
		if !strings.EqualFold(t, table) && !strings.EqualFold("public."+t, table) {
			v.warn(key+"."+t, "is for table %s, which outboxd does not stream (postgres.table is %s); ignored", t, table)
			continue
		}
		if !ok {
			return "", "", fmt.Errorf("%s lists %s but %s.%s is not set; remove it from the list, or convert without it and write postgres.backfill.where by hand", key, t, key, t)
		}
		if found {
			continue
		}
		found = true
		where, orderBy, err = selectWhere(stmt, table)
		if err != nil {
			return "", "", fmt.Errorf("%s.%s %q %v; convert without it and write postgres.backfill.where (and order_by) by hand: the condition the rows to send match", key, t, stmt, err)
		}
	}
	for k := range v.cfg {
		if t := strings.TrimPrefix(k, key+"."); t != k && !containsFold(listed, t) {
			v.warn(k, "is not listed in %s, so Debezium did not use it; ignored", key)
		}
	}
	return where, orderBy, nil
}

func containsFold(list []string, s string) bool {
	for _, e := range list {
		if strings.EqualFold(e, s) {
			return true
		}
	}
	return false
}

// ident is an SQL identifier, quoted or not.
const ident = `(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_$]*)`

var (
	// selectStar is SELECT * FROM [schema.]table [WHERE cond] [ORDER BY column [ASC]] [;].
	selectStar = regexp.MustCompile(`(?is)^\s*select\s+\*\s+from\s+(` + ident + `(?:\s*\.\s*` + ident + `)?)(?:\s+where\s+(.*?))?(?:\s+order\s+by\s+(` + ident + `)(?:\s+asc)?)?\s*;?\s*$`)
	// notACondition are what a WHERE body cannot hold safely when taken
	// out of its statement; a condition holding one is refused.
	notACondition = regexp.MustCompile(`(?i);|--|/\*|\b(order|limit|offset|fetch|union|intersect|except|group|having|window|for|join|returning)\b`)
	dot           = regexp.MustCompile(`\s*\.\s*`)
	// literal is a quoted string or identifier, whose words and
	// punctuation notACondition must not read as SQL ('' and "" escape).
	literal = regexp.MustCompile(`'(?:[^']|'')*'|"(?:[^"]|"")*"`)
)

// selectWhere takes the condition out of SELECT * FROM table WHERE cond, and
// refuses any other statement (columns chosen, joins, limits, another
// table): its rows are not the table's rows as outboxd's backfill sends them.
func selectWhere(stmt, table string) (where, orderBy string, err error) {
	m := selectStar.FindStringSubmatch(stmt)
	if m == nil {
		return "", "", fmt.Errorf("is not SELECT * FROM %s [WHERE condition] [ORDER BY column]", table)
	}
	if !sameTable(m[1], table) {
		return "", "", fmt.Errorf("reads %s, not the outbox table %s", m[1], table)
	}
	where = strings.TrimSpace(m[2])
	if where == "" {
		where = "true"
	}
	if bad := notACondition.FindString(literal.ReplaceAllString(where, "''")); bad != "" {
		return "", "", fmt.Errorf("has %q in its condition, which outboxd does not take apart", bad)
	}
	return where, unquote(m[3]), nil
}

// sameTable compares a table name as written in SQL with schema.table:
// unquoted names fold to lower case, a name without a schema is public's.
func sameTable(sql, table string) bool {
	parts := dot.Split(sql, -1)
	if len(parts) == 1 {
		parts = []string{"public", parts[0]}
	}
	want := strings.SplitN(table, ".", 2)
	if len(parts) != 2 || len(want) != 2 {
		return false
	}
	for i, p := range parts {
		if q := unquote(p); q != want[i] && (strings.HasPrefix(p, `"`) || !strings.EqualFold(q, want[i])) {
			return false
		}
	}
	return true
}

func unquote(id string) string {
	if strings.HasPrefix(id, `"`) {
		return strings.Trim(id, `"`)
	}
	return strings.ToLower(id)
}
