// CuratorLock: a real Apache Curator InterProcessMutex, driven line by line
// over stdin/stdout, so the Rust interop test can prove that Curator and
// lockwright's ZooKeeper backend exclude each other both ways.
//
// The test runs it with Java's single-file source launcher (no compile step):
//
//   java -cp /usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar \
//        CuratorLock.java <connectString> <lockPath> [user:password]
//
// (curator-recipes.jar's manifest Class-Path pulls in curator-framework,
// curator-client, zookeeper, zookeeper-jute, guava and slf4j-api.)
//
// It prints "ready" once connected, then answers each command with one line:
//   try            -> acquired | busy       (acquire(0 ms))
//   acquire <ms>   -> acquired | timeout
//   release        -> released
//   nodes          -> nodes <sorted, comma-separated children of lockPath>
//   quit (or EOF)  -> closes the client, exit 0
// Any failure prints "error <class>: <message>" and the loop goes on.
// With user:password it authenticates with the digest scheme and creates
// every node with CREATOR_ALL_ACL. Exit 2 if it cannot connect in 10 s.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        if (args.length < 2 || args.length > 3) {
            System.err.println("usage: CuratorLock.java <connectString> <lockPath> [user:password]");
            System.exit(64);
        }
        String lockPath = args[1];

        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(4000)
                .connectionTimeoutMs(3000)
                .retryPolicy(new ExponentialBackoffRetry(100, 3));
        if (args.length == 3) {
            builder.authorization("digest", args[2].getBytes(StandardCharsets.UTF_8))
                    .aclProvider(new ACLProvider() {
                        public List<ACL> getDefaultAcl() { return ZooDefs.Ids.CREATOR_ALL_ACL; }
                        public List<ACL> getAclForPath(String path) { return ZooDefs.Ids.CREATOR_ALL_ACL; }
                    });
        }
        CuratorFramework client = builder.build();
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            System.err.println("CuratorLock: could not connect to " + args[0] + " within 10 s");
            System.exit(2); // no close(): with no server it would block for seconds more
        }

        InterProcessMutex mutex = new InterProcessMutex(client, lockPath);
        System.out.println("ready");
        System.out.flush();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split("\\s+");
            if (cmd[0].equals("quit")) break;
            String reply;
            try {
                reply = run(client, mutex, lockPath, cmd);
            } catch (Exception e) {
                reply = "error " + e.getClass().getName() + ": " + e.getMessage();
            }
            System.out.println(reply.replaceAll("[\r\n]+", " "));
            System.out.flush();
        }
        client.close();
        System.exit(0);
    }

    static String run(CuratorFramework client, InterProcessMutex mutex, String lockPath, String[] cmd)
            throws Exception {
        switch (cmd[0]) {
            case "try":
                return mutex.acquire(0, TimeUnit.MILLISECONDS) ? "acquired" : "busy";
            case "acquire":
                long ms = Long.parseLong(cmd[1]);
                return mutex.acquire(ms, TimeUnit.MILLISECONDS) ? "acquired" : "timeout";
            case "release":
                mutex.release();
                return "released";
            case "nodes":
                List<String> children;
                try {
                    children = new ArrayList<>(client.getChildren().forPath(lockPath));
                } catch (KeeperException.NoNodeException e) {
                    children = new ArrayList<>(); // lock path not created yet: no contenders
                }
                children.sort(null);
                return "nodes " + String.join(",", children);
            default:
                return "error unknown command: " + String.join(" ", cmd);
        }
    }
}
