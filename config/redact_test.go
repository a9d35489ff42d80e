package config_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxd/outboxd/config"
)

func TestRedactDSN(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u:secret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgresql://u:secret@h:5432/db?sslmode=disable", "postgresql://u:xxxxx@h:5432/db?sslmode=disable"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"postgres://h/db", "postgres://h/db"},
		{"postgres://u@h/db?password=secret", "postgres://u@h/db?password=xxxxx"},
		{"postgres://u:secret@h/db?password=secret2", "postgres://u:xxxxx@h/db?password=xxxxx"},
		{"postgres://u:p%40ss@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:sec ret@h/db", "postgres://u:xxxxx@h/db"},
		{"password=secret", "password=xxxxx"},
		{"host=h password=secret dbname=db", "host=h password=xxxxx dbname=db"},
		{"host=h password = secret dbname=db", "host=h password = xxxxx dbname=db"},
		{"host=h password='sec ret' dbname=db", "host=h password=xxxxx dbname=db"},
		{`host=h password='x\' secret' dbname=db`, "host=h password=xxxxx dbname=db"},
		{"host=h PASSWORD=secret", "host=h PASSWORD=xxxxx"},
		{"host=h sslpassword=secret", "host=h sslpassword=xxxxx"},
		{"host=h user=app", "host=h user=app"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := config.RedactDSN(tt.dsn); got != tt.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
	}
}

// secretDSNs carry the password "secret" in every form pgconn accepts, each
// also made invalid (by a bad port or sslmode) so that Validate reports it.
var secretDSNs = []string{
	"postgres://u:secret@h/db",
	"postgresql://u:secret@h:5432/db",
	"postgres://u:secret@h:notaport/db",
	"postgres://u:secret@h:99999999/db",
	"postgres://u:secret@h/db?sslmode=sometimes",
	"postgres://u@h/db?password=secret&sslmode=sometimes",
	"postgres://u:secret@h/db?password=secret&port=x",
	"postgres://u:sec%20ret@h:x/db",
	"postgres://u:secret@[::1/db",
	"postgres://u:secret@h/db?connect_timeout=soon",
	"password=secret",
	"host=h password=secret",
	"host=h password=secret port=notaport",
	"password=secret host=h port=notaport",
	"host=h password='secret' port=notaport",
	"host=h password='sec ret' port=notaport",
	"host=h password = secret port=notaport",
	"host=h password= secret port=notaport",
	"host=h password =secret port=notaport",
	`host=h password='x\' secret' port=notaport`,
	"host=h password=secret sslmode=sometimes",
	"host=h password=secret connect_timeout=soon",
	"host=h\tpassword=secret\tport=notaport",
	// libpq (and pgconn) end the userinfo at the first '@' before any '/',
	// so '#' and '?' belong to the password; net/url disagrees.
	"postgres://u:2024#secret@h/db",
	"postgres://u:2024?secret@h/db",
	"postgres://u@h/db?sslpassword=secret",
	"host=h sslpassword=secret",
}

// TestSecretsNeverShown checks Validate's errors and Redacted for every DSN
// form: the password must not appear.
func TestSecretsNeverShown(t *testing.T) {
	for _, dsn := range secretDSNs {
		t.Run(dsn, func(t *testing.T) {
			cfg := config.Default()
			cfg.Postgres.DSN = dsn
			cfg.Postgres.Slot = "Bad-Slot" // another error alongside
			err := cfg.Validate()
			if err == nil {
				t.Fatal("Validate accepted a bad slot name")
			}
			if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "sec ret") {
				t.Errorf("Validate() error shows the password: %v", err)
			}
			if got := cfg.Redacted().Postgres.DSN; strings.Contains(got, "secret") || strings.Contains(got, "sec ret") {
				t.Errorf("Redacted() DSN shows the password: %q", got)
			}
			if cfg.Postgres.DSN != dsn {
				t.Error("Redacted modified the original config")
			}
		})
	}
}

// TestSecretsNotInLoadErrors checks that a config file holding a DSN with a
// password does not leak it through decode or environment errors.
func TestSecretsNotInLoadErrors(t *testing.T) {
	path := writeFile(t, "postgres:\n  dsn: postgres://u:secret@h/db\n  slto: x\n")
	_, err := config.Load(path, nil)
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Load = %v", err)
	}
	_, err = config.Load("", []string{"OUTBOXD_POSTGRES_DSN=postgres://u:secret@h/db", "OUTBOXD_NOPE=1"})
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Load = %v", err)
	}
}

// FuzzRedactDSN checks RedactDSN against pgconn's own parse: whenever pgconn
// finds a password that appears literally in the connection string,
// RedactDSN's output must not contain it.
func FuzzRedactDSN(f *testing.F) {
	for _, dsn := range secretDSNs {
		f.Add(dsn)
	}
	f.Add("host=h user=u password=hunter2hunter2 dbname=d")
	f.Add("postgres://user:hunter2hunter2@host:5432/db?application_name=x")
	f.Fuzz(func(t *testing.T, dsn string) {
		got := config.RedactDSN(dsn)
		pc, err := pgconn.ParseConfig(dsn)
		if err != nil || len(pc.Password) < 6 || strings.Count(dsn, pc.Password) != 1 || strings.Contains("xxxxx", pc.Password) {
			return
		}
		if strings.Contains(got, pc.Password) {
			t.Fatalf("RedactDSN(%q) = %q shows password %q", dsn, got, pc.Password)
		}
	})
}
