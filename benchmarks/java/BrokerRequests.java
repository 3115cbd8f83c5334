// The requests an Apache Kafka broker has served so far, by type, and the bytes it took in
// and sent out: read from its own metrics over JMX, attached to its JVM by pid (no port
// opened, no restart). Run as a single source file: java BrokerRequests.java PID
//
// Prints one line per figure, "name<TAB>count": each request type's
// kafka.network:type=RequestMetrics,name=RequestsPerSec count (summed over versions), then
// BytesInPerSec and BytesOutPerSec of kafka.server:type=BrokerTopicMetrics.
import com.sun.tools.attach.VirtualMachine;
import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
    public static void main(String[] args) throws Exception {
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        String address = vm.startLocalManagementAgent();
        vm.detach();
        try (JMXConnector connector = JMXConnectorFactory.connect(new JMXServiceURL(address))) {
            MBeanServerConnection server = connector.getMBeanServerConnection();
            Map<String, Long> counts = new TreeMap<>();
            ObjectName requests =
                new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
            for (ObjectName name : server.queryNames(requests, null)) {
                long count = ((Number) server.getAttribute(name, "Count")).longValue();
                counts.merge(name.getKeyProperty("request"), count, Long::sum);
            }
            for (String bytes : new String[] {"BytesInPerSec", "BytesOutPerSec"}) {
                ObjectName name =
                    new ObjectName("kafka.server:type=BrokerTopicMetrics,name=" + bytes);
                counts.put(bytes, ((Number) server.getAttribute(name, "Count")).longValue());
            }
            counts.forEach((name, count) -> System.out.println(name + "\t" + count));
        }
    }
}
