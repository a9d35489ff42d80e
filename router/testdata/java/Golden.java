// Golden outputs of Kafka Connect's Jackson and of Java's BigDecimal, for
// router's byte-for-byte tests. Regenerate (Java 17, with the jackson-core,
// jackson-databind and jackson-annotations jars Kafka Connect ships, as
// bench/fetch-connect caches them) from router/testdata:
//   CP=$(ls ~/.cache/outboxd/bench/connect-*/libs/jackson-{core,databind,annotations}-*.jar | tr '\n' :)
//   javac -d /tmp/golden -cp "$CP" java/Golden.java && java -cp "$CP:/tmp/golden" Golden .
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.TextNode;
import java.io.PrintWriter;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HexFormat;
import java.util.Random;

public class Golden {
    public static void main(String[] args) throws Exception {
        String dir = args[0];
        ObjectMapper m = new ObjectMapper(); // as JsonConverter's serializer writes a JsonNode
        HexFormat hex = HexFormat.of();
        String[] samples = {
            "", "o-42", "k\uD83D\uDE42", "\uD834\uDD1E\uDBFF\uDFFF\uD800\uDC00", "<&>", "\u2028\u2029",
            "\u0000\u0001\u001f\u007f\u0080\u00e9\u4e2d", "a\"b\\c/", "\b\f\n\r\t\u000b", "\uFFFD\uFFFE\uFFFF",
            "caf\u00e9 \u65e5\u672c \uD83C\uDDE9\uD83C\uDDEA",
        };
        try (PrintWriter w = new PrintWriter(dir + "/jackson_strings.golden", "UTF-8")) {
            w.println("# UTF-8 of a Java String (hex) <TAB> Jackson's bytes for it as a JSON string (hex); by java/Golden.java");
            for (String s : samples) {
                w.println(hex.formatHex(s.getBytes(StandardCharsets.UTF_8)) + "\t" + hex.formatHex(m.writeValueAsBytes(TextNode.valueOf(s))));
            }
        }
        // Every code point but the surrogates, 256 to a string, plane by plane.
        try (PrintWriter w = new PrintWriter(dir + "/jackson_planes.golden", "UTF-8")) {
            w.println("# plane <TAB> SHA-256 over Jackson's bytes of each run of 256 code points of the plane (surrogates left out); by java/Golden.java");
            for (int plane = 0; plane <= 16; plane++) {
                MessageDigest d = MessageDigest.getInstance("SHA-256");
                for (int start = plane << 16; start < (plane + 1) << 16; start += 256) {
                    StringBuilder b = new StringBuilder();
                    for (int cp = start; cp < start + 256; cp++) {
                        if (cp < 0xD800 || cp > 0xDFFF) {
                            b.appendCodePoint(cp);
                        }
                    }
                    d.update(m.writeValueAsBytes(TextNode.valueOf(b.toString())));
                }
                w.println(plane + "\t" + hex.formatHex(d.digest()));
            }
        }
        try (PrintWriter w = new PrintWriter(dir + "/bigdecimal.golden", "UTF-8")) {
            w.println("# Postgres text of a numeric(p,s) <TAB> new BigDecimal(text).toString(); by java/Golden.java");
            String[] fixed = {"0.00000000", "0.00000001", "0.00000010", "-0.00000050", "0", "-0.00", "100", "123.4500",
                "0.000001", "0.0000001", "0.0000010", "1.000000", "12345678901234567890.123", "-1", "0.1", "10.00000000",
                "0.000000000000000000000000000001", "-12.3400000000"};
            for (String s : fixed) {
                w.println(s + "\t" + new BigDecimal(s));
            }
            Random r = new Random(33);
            for (int i = 0; i < 400; i++) {
                int intDigits = r.nextInt(4), scale = r.nextInt(12);
                StringBuilder b = new StringBuilder(r.nextBoolean() ? "-" : "");
                b.append(intDigits == 0 ? "0" : Integer.toString(r.nextInt((int) Math.pow(10, intDigits))));
                if (scale > 0) {
                    b.append('.');
                    int lead = r.nextInt(scale + 1);
                    for (int k = 0; k < scale; k++) {
                        b.append(k < lead ? '0' : (char) ('0' + r.nextInt(10)));
                    }
                }
                String s = b.toString();
                if (s.startsWith("-") && new BigDecimal(s).signum() == 0) {
                    s = s.substring(1); // Postgres prints no negative zero
                }
                w.println(s + "\t" + new BigDecimal(s));
            }
        }
    }
}
