// CuratorLeader: a real Apache Curator LeaderSelector, driven line by line
// over stdin/stdout, so the Rust interop test can prove that Curator's
// leader election and lockwright's (on the ZooKeeper backend) are one
// election: each sees the other's leader and its id, and waits its turn.
//
// Run with Java's single-file source launcher, as CuratorLock.java:
//
//   java -cp /usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar \
//        CuratorLeader.java <connectString> <leaderPath> <participantId>
//
// It prints "ready" once connected, then answers each command with one line:
//   start          -> started      (a new LeaderSelector with the id joins;
//                                   no requeue after its leadership ends)
//   stop           -> stopped      (its takeLeadership returns, so it gives
//                                   up leadership, or leaves the queue)
//   leader         -> leader <getLeader().getId()>
//   has            -> has true | has false   (hasLeadership())
//   quit (or EOF)  -> closes the selector and the client, exit 0
// and prints "leading" on its own when takeLeadership starts, which then
// blocks until "stop". Any failure prints "error <class>: <message>" and
// the loop goes on. Exit 2 if it cannot connect in 10 s.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorLeader {
    private static CuratorFramework client;
    private static String leaderPath;
    private static String id;
    private static LeaderSelector selector;
    private static CountDownLatch release = new CountDownLatch(0);

    // Lines come from the command loop and from the leadership thread.
    static synchronized void say(String line) {
        System.out.println(line.replaceAll("[\r\n]+", " "));
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: CuratorLeader.java <connectString> <leaderPath> <participantId>");
            System.exit(64);
        }
        leaderPath = args[1];
        id = args[2];
        client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(4000)
                .connectionTimeoutMs(3000)
                .retryPolicy(new ExponentialBackoffRetry(100, 3))
                .build();
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            System.err.println("CuratorLeader: could not connect to " + args[0] + " within 10 s");
            System.exit(2);
        }
        say("ready");

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String cmd = line.trim();
            if (cmd.equals("quit")) break;
            String reply;
            try {
                reply = run(cmd);
            } catch (Exception e) {
                reply = "error " + e.getClass().getName() + ": " + e.getMessage();
            }
            say(reply);
        }
        release.countDown();
        if (selector != null) selector.close();
        client.close();
        System.exit(0);
    }

    static String run(String cmd) throws Exception {
        switch (cmd) {
            case "start":
                if (selector != null) selector.close();
                final CountDownLatch latch = new CountDownLatch(1);
                release = latch;
                selector = new LeaderSelector(client, leaderPath, new LeaderSelectorListenerAdapter() {
                    @Override
                    public void takeLeadership(CuratorFramework c) throws Exception {
                        say("leading");
                        latch.await();
                    }
                });
                selector.setId(id);
                selector.start();
                return "started";
            case "stop":
                release.countDown();
                if (selector != null) selector.close();
                selector = null;
                return "stopped";
            case "leader":
                if (selector == null) return "error no selector: start first";
                return "leader " + selector.getLeader().getId();
            case "has":
                return "has " + (selector != null && selector.hasLeadership());
            default:
                return "error unknown command: " + cmd;
        }
    }
}
