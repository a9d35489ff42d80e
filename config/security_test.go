package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/config"
)

// writeFile writes content into a file in a temporary directory.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// selfSigned writes a self-signed certificate and its PKCS#8 key as PEM.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = writeTemp(t, "cert.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyFile = writeTemp(t, "key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk})))
	return certFile, keyFile
}

func TestSecurityEnvNames(t *testing.T) {
	cfg, err := config.Load("", []string{
		"OUTBOXD_POSTGRES_PASSWORD_FILE=/run/secrets/pg",
		"OUTBOXD_KAFKA_TLS_ENABLED=true",
		"OUTBOXD_KAFKA_TLS_CA_FILE=/ca.pem",
		"OUTBOXD_KAFKA_TLS_CERT_FILE=/cert.pem",
		"OUTBOXD_KAFKA_TLS_KEY_FILE=/key.pem",
		"OUTBOXD_KAFKA_TLS_SERVER_NAME=kafka.internal",
		"OUTBOXD_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
		"OUTBOXD_KAFKA_SASL_USERNAME=alice",
		"OUTBOXD_KAFKA_SASL_PASSWORD=secret",
		"OUTBOXD_KAFKA_SASL_PASSWORD_FILE=/run/secrets/kafka",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := config.Kafka{}
	want.TLS = config.TLS{Enabled: true, CAFile: "/ca.pem", CertFile: "/cert.pem", KeyFile: "/key.pem", ServerName: "kafka.internal"}
	want.SASL = config.SASL{Mechanism: "SCRAM-SHA-512", Username: "alice", Password: "secret", PasswordFile: "/run/secrets/kafka"}
	if cfg.Postgres.PasswordFile != "/run/secrets/pg" || cfg.Kafka.TLS != want.TLS || cfg.Kafka.SASL != want.SASL {
		t.Fatalf("got postgres.password_file %q, kafka.tls %+v, kafka.sasl %+v", cfg.Postgres.PasswordFile, cfg.Kafka.TLS, cfg.Kafka.SASL)
	}
}

func TestSecretFiles(t *testing.T) {
	for _, tt := range []struct{ content, want string }{
		{"pw", "pw"}, {"pw\n", "pw"}, {"pw\r\n", "pw"}, {"pw\n\n", "pw\n"}, {" pw ", " pw "},
	} {
		f := writeTemp(t, "secret", tt.content)
		got, err := config.Postgres{PasswordFile: f}.Password()
		if err != nil || got != tt.want {
			t.Errorf("postgres.password_file holding %q: got %q, %v; want %q", tt.content, got, err, tt.want)
		}
		got, err = config.SASL{PasswordFile: f, Password: "ignored"}.Secret()
		if err != nil || got != tt.want {
			t.Errorf("kafka.sasl.password_file holding %q: got %q, %v; want %q", tt.content, got, err, tt.want)
		}
	}
	if pw, err := (config.Postgres{}).Password(); pw != "" || err != nil {
		t.Errorf("no password file: got %q, %v", pw, err)
	}
	if pw, _ := (config.SASL{Password: "p"}).Secret(); pw != "p" {
		t.Errorf("kafka.sasl.password: got %q", pw)
	}
}

func TestValidateSecurity(t *testing.T) {
	const secret = "Sup3r-s3cret"
	cert, key := selfSigned(t)
	notPEM := writeTemp(t, "not.pem", secret+"\n")
	empty := writeTemp(t, "empty", "\n")
	pwFile := writeTemp(t, "pw", secret+"\n")
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		edit func(*config.Config)
		want string // "" for valid
	}{
		{"TLS with CA", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true, CAFile: cert} }, ""},
		{"TLS with system CAs", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true} }, ""},
		{"TLS with client certificate", func(c *config.Config) {
			c.Kafka.TLS = config.TLS{Enabled: true, CAFile: cert, CertFile: cert, KeyFile: key, ServerName: "k"}
		}, ""},
		{"TLS settings while disabled", func(c *config.Config) { c.Kafka.TLS = config.TLS{CAFile: cert} }, "kafka.tls.enabled: is false while"},
		{"CA missing", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true, CAFile: missing} }, "kafka.tls.ca_file: open " + missing + ": no such file"},
		{"CA not PEM", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true, CAFile: notPEM} }, "kafka.tls.ca_file: " + notPEM + " holds no PEM certificate"},
		{"certificate without key", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true, CertFile: cert} }, "kafka.tls.key_file: must be set"},
		{"key without certificate", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true, KeyFile: key} }, "kafka.tls.cert_file: must be set"},
		{"key not PEM", func(c *config.Config) { c.Kafka.TLS = config.TLS{Enabled: true, CertFile: cert, KeyFile: notPEM} }, "kafka.tls.cert_file, kafka.tls.key_file: not a PEM certificate"},
		{"SCRAM-SHA-512", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "SCRAM-SHA-512", Username: "u", Password: secret}
		}, ""},
		{"SCRAM-SHA-256 from a file", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: pwFile}
		}, ""},
		{"PLAIN", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Username: "u", Password: secret}
		}, ""},
		{"unknown mechanism", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "GSSAPI", Username: "u", Password: secret}
		}, `kafka.sasl.mechanism: "GSSAPI" must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512`},
		{"credentials without mechanism", func(c *config.Config) { c.Kafka.SASL = config.SASL{Username: "u", Password: secret} }, "kafka.sasl.mechanism: must be PLAIN"},
		{"no username", func(c *config.Config) { c.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Password: secret} }, "kafka.sasl.username: must not be empty"},
		{"no password", func(c *config.Config) { c.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Username: "u"} }, "kafka.sasl.password: must be set"},
		{"password and file", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Username: "u", Password: secret, PasswordFile: pwFile}
		}, "kafka.sasl.password: set kafka.sasl.password or kafka.sasl.password_file, not both"},
		{"SASL password file missing", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Username: "u", PasswordFile: missing}
		}, "kafka.sasl.password_file: cannot read the secret file: open " + missing},
		{"SASL password file empty", func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Username: "u", PasswordFile: empty}
		}, "kafka.sasl.password_file: " + empty + " is empty"},
		{"postgres password file", func(c *config.Config) { c.Postgres.PasswordFile = pwFile }, ""},
		{"postgres password file missing", func(c *config.Config) { c.Postgres.PasswordFile = missing }, "postgres.password_file: cannot read the secret file: open " + missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			tt.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tt.want == "":
				return
			case err == nil:
				t.Fatalf("want an error containing %q, got none", tt.want)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("error %q does not contain %q", err, tt.want)
			case strings.Contains(err.Error(), secret):
				t.Fatalf("error shows the secret: %v", err)
			}
		})
	}
}

func TestRedactedHidesSASLPassword(t *testing.T) {
	cfg := config.Default()
	cfg.Kafka.SASL = config.SASL{Mechanism: "PLAIN", Username: "u", Password: "secret"}
	cfg.Postgres.DSN = "postgres://u:pgsecret@h/db"
	r := cfg.Redacted()
	if r.Kafka.SASL.Password != "xxxxx" || strings.Contains(r.Postgres.DSN, "pgsecret") {
		t.Fatalf("Redacted: sasl.password %q, dsn %q", r.Kafka.SASL.Password, r.Postgres.DSN)
	}
	if cfg.Kafka.SASL.Password != "secret" {
		t.Fatal("Redacted changed the original")
	}
	if got := config.Default().Redacted().Kafka.SASL.Password; got != "" {
		t.Fatalf("an unset password is shown as %q, want empty", got)
	}
}
