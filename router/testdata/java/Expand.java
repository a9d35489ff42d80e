// Golden outputs of Debezium's table.expand.json.payload under Kafka
// Connect's JsonConverter (schemas off), for router's expansion tests: the
// EventRouter's own steps (parseJsonPayload, JsonSchemaData, the catch that
// sends the payload unexpanded) with Debezium's and Kafka Connect's classes.
// Regenerate from router/testdata (Java 17; bench/fetch-connect's cache):
//   B=~/.cache/outboxd/bench; CP=$(ls $B/connect-*/libs/*.jar $B/debezium-*/plugins/debezium-connector-postgres/*.jar | tr '\n' :)
//   javac -d /tmp/golden -cp "$CP" java/Expand.java && java -cp "$CP:/tmp/golden" Expand .
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.debezium.data.Json;
import io.debezium.transforms.outbox.JsonSchemaData;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.Map;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.json.JsonConverter;

public class Expand {
    public static void main(String[] args) throws Exception {
        String[] payloads = {
            "{\"a\": 1, \"b\": [1, 2]}", "{\"n\": 1.10, \"s\": 0.00000015, \"big\": 1e300, \"neg\": -0.0, \"e\": 1E2, \"i\": 2147483648}",
            "{\"x\": null, \"y\": [], \"z\": {}, \"k\": \"v\"}", "{\"a\":[{\"p\":1},{\"q\":\"x\"},{\"p\":2,\"q\":\"y\"}]}",
            "{\"a\":[{\"p\":1},{\"p\":\"x\"}]}", "{\"a\":[1,\"x\"]}", "{\"a\":[1,10000000000]}", "{\"a\":[null,1,null]}", "{\"a\":[null]}",
            "{\"a\":[[1,2],[3]]}", "{\"a\":[[],[1]]}", "{\"a\":[[1],[\"x\"]]}", "{\"big\": 123456789012345678901234567890}",
            "[1, 2]", "[]", "[1, \"x\"]", "[null]", "\"just a string\"", "42", "{not json", "{\"a\":1} trailing", " {\"a\":1}",
            "{\"s\": \"<&>\\u2028\\u001f\\ud83d\\ude42\", \"t\": true, \"f\": false}", "{\"dup\": 1, \"other\": 2, \"dup\": 3}",
            "{\"d\": [1.5, 2.25, 1e-5, 123456789.0, 1e7, 0.001, 0.0001]}", "{\"m\": 4.9e-324, \"x\": 1.7976931348623157e308, \"h\": 0.1, \"t\": 100}",
            "{\"a\":{\"b\":{\"c\":[{\"d\":null}]}}}", "",
        };
        ObjectMapper mapper = new ObjectMapper();
        JsonSchemaData jsd = new JsonSchemaData();
        JsonConverter conv = new JsonConverter();
        conv.configure(Map.of("schemas.enable", "false"), false);
        HexFormat hex = HexFormat.of();
        try (PrintWriter w = new PrintWriter(args[0] + "/expand.golden", "UTF-8")) {
            w.println("# payload (hex) <TAB> the value Debezium's EventRouter sent with table.expand.json.payload under JsonConverter, schemas off (hex), or DIES; by java/Expand.java");
            for (String p : payloads) {
                Schema schema = Json.builder().optional().build();
                Object payload = p;
                try {
                    if (!(p.startsWith("{") || p.startsWith("["))) {
                        throw new Exception("Unable to parse payload");
                    }
                    JsonNode n = mapper.readTree(p);
                    schema = jsd.toConnectSchema("payload", n);
                    payload = jsd.toConnectData(n, schema);
                }
                catch (Exception e) {
                    // EventRouterDelegate: "JSON expansion failed", the payload is sent as it is
                }
                String out;
                try {
                    out = hex.formatHex(conv.fromConnectData("t", schema, payload));
                }
                catch (Exception e) {
                    out = "DIES";
                }
                w.println(hex.formatHex(p.getBytes(StandardCharsets.UTF_8)) + "\t" + out);
            }
        }
    }
}
