// A consumer loop with segmentio/kafka-go whose failed records come back later through
// blackbox: value, key and headers byte for byte, after 1 s, then 5 s, then 30 s; after the
// last attempt on TOPIC.dlq. Consumes TOPIC for SECONDS:
//
//	KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 BLACKBOX_CALLER=orders-worker \
//	go run ./retry TOPIC SECONDS
//
// Each record's offset is committed only once blackbox's intake topic has acknowledged its
// retry: a worker that dies in between reads the record again and sends the same retry,
// which blackbox schedules once (its id is the record's coordinates and attempt).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// The waits after the first, second and third failure: four attempts in all.
const policy = `{"delays": [1, 5, 30]}`

func main() {
	brokers := strings.Split(env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"), ",")
	caller := env("BLACKBOX_CALLER", "orders-worker")
	topic := os.Args[1]
	seconds, err := strconv.Atoi(os.Args[2])
	if err != nil {
		log.Fatalf("SECONDS: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
	defer cancel()

	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers:           brokers,
		GroupID:           caller, // the worker's consumer group
		Topic:             topic,
		StartOffset:       kafka.FirstOffset,
		CommitInterval:    0,               // CommitMessages commits at once, when called
		SessionTimeout:    6 * time.Second, // a dead worker's partitions move on after 6 s
		HeartbeatInterval: 500 * time.Millisecond,
	})
	defer reader.Close()
	writer := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        env("BLACKBOX_INTAKE_TOPIC", "blackbox"),
		Balancer:     &kafka.Murmur2Balancer{}, // partitions keys as Java does
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 10 * time.Millisecond, // one retry at a time: do not wait for a batch
	}
	defer writer.Close()

	for {
		message, err := reader.FetchMessage(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			return
		} else if err != nil {
			log.Fatalf("fetch: %v", err)
		}
		// The deadline stops fetching, not a record's retry or commit.
		outcome := "ok"
		if err := process(message); err != nil {
			// The partition moves on; the record comes back after its backoff.
			if err := writer.WriteMessages(context.Background(), retryRequest(message, caller, err)); err != nil {
				log.Fatalf("blackbox did not acknowledge the retry: %v", err)
			}
			outcome = "failed"
		}
		if err := reader.CommitMessages(context.Background(), message); err != nil {
			log.Fatalf("commit: %v", err)
		}
		fmt.Printf("processed %s/%d/%d attempt %d %s\n", message.Topic, message.Partition,
			message.Offset, attempt(message), outcome)
	}
}

// process is the user's work. This one fails every record's first attempt, so that a retry
// shows.
func process(message kafka.Message) error {
	if attempt(message) == 1 {
		return errors.New("the first attempt fails, on purpose")
	}
	return nil
}

// attempt is 1 for a record as it was first written; blackbox numbers the attempts it
// delivers.
func attempt(message kafka.Message) int {
	n := 1
	for _, header := range message.Headers {
		if header.Key == "blackbox-retry-attempt" {
			n, _ = strconv.Atoi(string(header.Value))
		}
	}
	return n
}

// retryRequest is the record's own key, value and headers (in order, repeats kept,
// blackbox-retry-* ones too: they count the attempts), less the caller and signature headers,
// which each request sets for itself; then this caller, the error, where the record was
// read, the backoff. Keyed by the record's own key: blackbox delivers it with that key, so
// the default partitioner puts it back on its partition.
func retryRequest(message kafka.Message, caller string, failure error) kafka.Message {
	headers := []kafka.Header{{Key: "CALLER_SERVICE", Value: []byte(caller)}}
	for _, header := range message.Headers {
		if header.Key != "CALLER_SERVICE" && header.Key != "blackbox-signature" {
			// kafka-go reads an empty header value as nil, which it would write as null.
			headers = append(headers, kafka.Header{Key: header.Key, Value: orEmpty(header.Value)})
		}
	}
	source := fmt.Sprintf("%s/%d/%d", message.Topic, message.Partition, message.Offset)
	headers = append(headers,
		// blackbox takes UTF-8 text only; an error may hold any bytes.
		kafka.Header{Key: "blackbox-retry-error", Value: []byte(strings.ToValidUTF8(failure.Error(), "\uFFFD"))},
		kafka.Header{Key: "blackbox-retry-source", Value: []byte(source)},
		kafka.Header{Key: "blackbox-retry-policy", Value: []byte(policy)},
	)
	// An empty value is read as nil too, and a null value would be a cancel.
	return kafka.Message{Key: message.Key, Value: orEmpty(message.Value), Headers: headers}
}

func orEmpty(data []byte) []byte {
	if data == nil {
		return []byte{}
	}
	return data
}

func env(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
