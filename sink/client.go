package sink

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/config"
)

// ClientOptions returns the franz-go options that reach the brokers of cfg:
// the seed brokers, the client id, TLS and SASL. A reader of a topic (the
// positions topic, a dead-letter topic) adds its own consuming options.
func ClientOptions(cfg config.Kafka) ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID(cfg.ClientID)}
	tlsCfg, err := cfg.TLS.Config()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if mech := saslMechanism(cfg.SASL); mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}
