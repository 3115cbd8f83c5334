// Schedule a signed message with segmentio/kafka-go: delivered to TOPIC in 2 seconds.
//
//	KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 BLACKBOX_SIGNING_KEY=billing.pem \
//	BLACKBOX_KEY_ID=billing-2026-11 go run . TOPIC
//
// The key pair comes from `blackbox keys new --key-id billing-2026-11 --out billing.pem`,
// which prints the policy entry for its public half.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

func main() {
	bootstrap := env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
	intake := env("BLACKBOX_INTAKE_TOPIC", "blackbox")
	key := readKey(os.Getenv("BLACKBOX_SIGNING_KEY"))
	topic := os.Args[1]

	id := "invoice-46"
	envelope := fmt.Sprintf(`{"topic": %q, "message": {"invoice": 46}, "countdown": 2, "id": %q}`,
		topic, id)
	message := kafka.Message{
		Key:     []byte(id), // keyed by the id: a later cancel lands on the same partition
		Value:   []byte(envelope),
		Headers: []kafka.Header{{Key: "CALLER_SERVICE", Value: []byte("billing")}},
	}
	sign(&message, intake, os.Getenv("BLACKBOX_KEY_ID"), key)

	writer := &kafka.Writer{
		Addr:         kafka.TCP(strings.Split(bootstrap, ",")...),
		Topic:        intake,
		Balancer:     &kafka.Murmur2Balancer{}, // partitions keys as Java does
		RequiredAcks: kafka.RequireAll,
	}
	defer writer.Close()
	if err := writer.WriteMessages(context.Background(), message); err != nil {
		log.Fatalf("the broker did not acknowledge the schedule: %v", err)
	}
}

// sign adds the blackbox-signature header, last, over every header set before it
// (see "Signing from any language").
func sign(message *kafka.Message, intake, keyID string, key ed25519.PrivateKey) {
	issued := time.Now().UnixMilli()
	random := make([]byte, 16)
	if _, err := rand.Read(random); err != nil {
		log.Fatal(err)
	}
	nonce := base64.RawURLEncoding.EncodeToString(random)
	lines := []string{"blackbox-signature-v1", intake, keyID, fmt.Sprint(issued), nonce,
		digest(message.Key), digest(message.Value)}
	for _, header := range message.Headers {
		lines = append(lines, digest([]byte(header.Key))+":"+digest(header.Value))
	}
	signed := strings.Join(lines, "\n") + "\n"
	signature := base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(signed)))
	value := fmt.Sprintf("v1 %s %d %s %s", keyID, issued, nonce, signature)
	message.Headers = append(message.Headers, kafka.Header{Key: "blackbox-signature", Value: []byte(value)})
}

func digest(data []byte) string {
	if data == nil {
		return "-"
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func readKey(path string) ed25519.PrivateKey {
	text, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	block, _ := pem.Decode(text)
	if block == nil {
		log.Fatalf("%s holds no PEM block", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		log.Fatal(err)
	}
	return key.(ed25519.PrivateKey)
}

func env(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
