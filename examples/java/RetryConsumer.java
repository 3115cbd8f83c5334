// A consumer loop with Apache Kafka's Java client whose failed records come back later
// through blackbox: value, key and headers byte for byte, after 1 s, then 5 s, then 30 s;
// after the last attempt on TOPIC.dlq. Consumes TOPIC for SECONDS:
//   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 BLACKBOX_CALLER=orders-worker \
//   java -cp 'lib/*' RetryConsumer.java TOPIC SECONDS
// Each record's offset is committed only once blackbox's intake topic has acknowledged its
// retry: a worker that dies in between reads the record again and sends the same retry,
// which blackbox schedules once (its id is the record's coordinates and attempt).
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class RetryConsumer {
    // The waits after the first, second and third failure: four attempts in all.
    static final String POLICY = "{\"delays\": [1, 5, 30]}";

    public static void main(String[] args) throws Exception {
        String bootstrap = System.getenv().getOrDefault("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092");
        String intake = System.getenv().getOrDefault("BLACKBOX_INTAKE_TOPIC", "blackbox");
        String caller = System.getenv().getOrDefault("BLACKBOX_CALLER", "orders-worker");
        String topic = args[0];
        Instant end = Instant.now().plusSeconds(Long.parseLong(args[1]));

        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerConfig(bootstrap, caller));
                KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerConfig(bootstrap))) {
            consumer.subscribe(List.of(topic));
            while (Instant.now().isBefore(end)) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    String outcome = "ok";
                    try {
                        process(record);
                    } catch (Exception e) {
                        // The partition moves on; the record comes back after its backoff.
                        producer.send(retryRequest(record, intake, caller, e)).get();
                        outcome = "failed";
                    }
                    consumer.commitSync(Map.of(new TopicPartition(record.topic(), record.partition()),
                            new OffsetAndMetadata(record.offset() + 1)));
                    System.out.printf("processed %s/%d/%d attempt %d %s%n", record.topic(),
                            record.partition(), record.offset(), attempt(record), outcome);
                }
            }
        }
    }

    // The user's work. This one fails every record's first attempt, so that a retry shows.
    static void process(ConsumerRecord<byte[], byte[]> record) {
        if (attempt(record) == 1) {
            throw new IllegalStateException("the first attempt fails, on purpose");
        }
    }

    // 1 for a record as it was first written; blackbox numbers the attempts it delivers.
    static int attempt(ConsumerRecord<byte[], byte[]> record) {
        Header header = record.headers().lastHeader("blackbox-retry-attempt");
        return header == null ? 1 : Integer.parseInt(new String(header.value(), StandardCharsets.UTF_8));
    }

    // The record's own key, value and headers (in order, repeats kept, blackbox-retry-* ones
    // too: they count the attempts), less the caller and signature headers, which each request
    // sets for itself; then this caller, the error, where the record was read, the backoff.
    static ProducerRecord<byte[], byte[]> retryRequest(
            ConsumerRecord<byte[], byte[]> record, String intake, String caller, Exception error) {
        // Keyed by the record's own key: blackbox delivers it with that key, so the default
        // partitioner puts it back on its partition. A null value would be a cancel.
        byte[] value = record.value() == null ? new byte[0] : record.value();
        ProducerRecord<byte[], byte[]> request = new ProducerRecord<>(intake, record.key(), value);
        request.headers().add("CALLER_SERVICE", bytes(caller));
        for (Header header : record.headers()) {
            if (!header.key().equals("CALLER_SERVICE") && !header.key().equals("blackbox-signature")) {
                request.headers().add(header);
            }
        }
        String source = record.topic() + "/" + record.partition() + "/" + record.offset();
        request.headers()
                .add("blackbox-retry-error", bytes(error.toString()))
                .add("blackbox-retry-source", bytes(source))
                .add("blackbox-retry-policy", bytes(POLICY));
        return request;
    }

    static Properties consumerConfig(String bootstrap, String caller) {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("group.id", caller); // the worker's consumer group
        config.put("enable.auto.commit", "false"); // committed by hand, after the work or the retry
        config.put("auto.offset.reset", "earliest");
        config.put("session.timeout.ms", "6000"); // a dead worker's partitions move on after 6 s
        config.put("heartbeat.interval.ms", "500");
        config.put("key.deserializer", ByteArrayDeserializer.class.getName());
        config.put("value.deserializer", ByteArrayDeserializer.class.getName());
        return config;
    }

    static Properties producerConfig(String bootstrap) {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("enable.idempotence", "true"); // a resent produce is not a second request
        config.put("acks", "all");
        config.put("key.serializer", ByteArraySerializer.class.getName());
        config.put("value.serializer", ByteArraySerializer.class.getName());
        return config;
    }

    static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
