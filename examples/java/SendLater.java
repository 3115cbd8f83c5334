// Schedule a signed message with Apache Kafka's Java client: delivered to TOPIC in 2 seconds.
//   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 BLACKBOX_SIGNING_KEY=billing.pem \
//   BLACKBOX_KEY_ID=billing-2026-11 java -cp 'lib/*' SendLater.java TOPIC
// The key pair comes from `blackbox keys new --key-id billing-2026-11 --out billing.pem`,
// which prints the policy entry for its public half.
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.MessageDigest;
import java.security.PrivateKey;
import java.security.SecureRandom;
import java.security.Signature;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.HexFormat;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class SendLater {
    public static void main(String[] args) throws Exception {
        String bootstrap = System.getenv().getOrDefault("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092");
        String intake = System.getenv().getOrDefault("BLACKBOX_INTAKE_TOPIC", "blackbox");
        String keyId = System.getenv("BLACKBOX_KEY_ID");
        PrivateKey privateKey = readKey(Path.of(System.getenv("BLACKBOX_SIGNING_KEY")));
        String topic = args[0];

        String id = "invoice-45";
        String envelope = "{\"topic\": \"" + topic + "\", \"message\": {\"invoice\": 45}, "
                + "\"countdown\": 2, \"id\": \"" + id + "\"}";
        // Keyed by the id: Java's default partitioner (murmur2) puts it on the partition
        // blackbox expects, and a later cancel on the same one.
        ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(
                intake, bytes(id), bytes(envelope));
        record.headers().add("CALLER_SERVICE", bytes("billing"));
        sign(record, keyId, privateKey);

        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("enable.idempotence", "true"); // a retried produce is not a second schedule
        config.put("key.serializer", ByteArraySerializer.class.getName());
        config.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config)) {
            producer.send(record).get(); // wait for the broker's acknowledgement
        }
    }

    // Adds the blackbox-signature header, last, over every header set before it
    // (see "Signing from any language").
    static void sign(ProducerRecord<byte[], byte[]> record, String keyId, PrivateKey key)
            throws Exception {
        long issued = System.currentTimeMillis();
        byte[] random = new byte[16];
        new SecureRandom().nextBytes(random);
        String nonce = Base64.getUrlEncoder().withoutPadding().encodeToString(random);
        StringBuilder signed = new StringBuilder()
                .append("blackbox-signature-v1\n")
                .append(record.topic()).append('\n')
                .append(keyId).append('\n')
                .append(issued).append('\n')
                .append(nonce).append('\n')
                .append(sha256(record.key())).append('\n')
                .append(sha256(record.value())).append('\n');
        for (Header header : record.headers()) {
            signed.append(sha256(bytes(header.key()))).append(':')
                    .append(sha256(header.value())).append('\n');
        }
        Signature ed25519 = Signature.getInstance("Ed25519");
        ed25519.initSign(key);
        ed25519.update(bytes(signed.toString()));
        String signature = Base64.getUrlEncoder().withoutPadding().encodeToString(ed25519.sign());
        String value = "v1 " + keyId + " " + issued + " " + nonce + " " + signature;
        record.headers().add("blackbox-signature", bytes(value));
    }

    static PrivateKey readKey(Path pem) throws Exception {
        String body = Files.readString(pem).replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(Base64.getDecoder().decode(body));
        return KeyFactory.getInstance("Ed25519").generatePrivate(spec);
    }

    static String sha256(byte[] data) throws Exception {
        if (data == null) {
            return "-";
        }
        return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(data));
    }

    static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
