// CuratorGroup: a real Apache Curator InterProcessSemaphoreV2 or
// InterProcessReadWriteLock, driven line by line over stdin/stdout, so the
// Rust interop tests can prove that Curator and lockwright's ZooKeeper
// backend share a semaphore's permits and exclude each other's readers and
// writers, both ways.
//
//   java -cp /usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar \
//        CuratorGroup.java <connectString> <path> sem <N>
//   java ... CuratorGroup.java <connectString> <path> rw
//
// It prints "ready" once connected, then answers each command with one line.
// sem:
//   try            -> acquired | busy       (one lease, acquire(1, 0 ms))
//   acquire <ms>   -> acquired | timeout
//   release        -> released              (returns the lease taken last)
//   leases         -> leases <number of lease nodes>
// rw:
//   try-read | try-write      -> acquired | busy
//   read <ms> | write <ms>    -> acquired | timeout
//   release-read | release-write -> released
//   nodes          -> nodes <sorted, comma-separated children of path>
// quit (or EOF) closes the client, exit 0. Any failure prints
// "error <class>: <message>" and the loop goes on. Exit 2 if it cannot
// connect in 10 s.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.KeeperException;

public class CuratorGroup {
    public static void main(String[] args) throws Exception {
        boolean sem = args.length == 4 && args[2].equals("sem");
        boolean rw = args.length == 3 && args[2].equals("rw");
        if (!sem && !rw) {
            System.err.println("usage: CuratorGroup.java <connectString> <path> (sem <N> | rw)");
            System.exit(64);
        }
        String path = args[1];
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(4000)
                .connectionTimeoutMs(3000)
                .retryPolicy(new ExponentialBackoffRetry(100, 3))
                .build();
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            System.err.println("CuratorGroup: could not connect to " + args[0] + " within 10 s");
            System.exit(2);
        }
        InterProcessSemaphoreV2 semaphore =
                sem ? new InterProcessSemaphoreV2(client, path, Integer.parseInt(args[3])) : null;
        InterProcessReadWriteLock lock = rw ? new InterProcessReadWriteLock(client, path) : null;
        Deque<Lease> leases = new ArrayDeque<>();
        System.out.println("ready");
        System.out.flush();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split("\\s+");
            if (cmd[0].equals("quit")) break;
            String reply;
            try {
                reply = sem ? semaphore(client, semaphore, leases, path, cmd) : rw(client, lock, path, cmd);
            } catch (Exception e) {
                reply = "error " + e.getClass().getName() + ": " + e.getMessage();
            }
            System.out.println(reply.replaceAll("[\r\n]+", " "));
            System.out.flush();
        }
        client.close();
        System.exit(0);
    }

    static String semaphore(CuratorFramework client, InterProcessSemaphoreV2 semaphore, Deque<Lease> leases,
            String path, String[] cmd) throws Exception {
        switch (cmd[0]) {
            case "try":
            case "acquire": {
                long ms = cmd[0].equals("try") ? 0 : Long.parseLong(cmd[1]);
                Lease lease = semaphore.acquire(ms, TimeUnit.MILLISECONDS);
                if (lease == null) return cmd[0].equals("try") ? "busy" : "timeout";
                leases.push(lease);
                return "acquired";
            }
            case "release":
                semaphore.returnLease(leases.pop());
                return "released";
            case "leases": {
                Collection<String> nodes = semaphore.getParticipantNodes();
                return "leases " + nodes.size();
            }
            default:
                return "error unknown command: " + String.join(" ", cmd);
        }
    }

    static String rw(CuratorFramework client, InterProcessReadWriteLock lock, String path, String[] cmd)
            throws Exception {
        switch (cmd[0]) {
            case "try-read":
                return lock.readLock().acquire(0, TimeUnit.MILLISECONDS) ? "acquired" : "busy";
            case "try-write":
                return lock.writeLock().acquire(0, TimeUnit.MILLISECONDS) ? "acquired" : "busy";
            case "read":
                return lock.readLock().acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS)
                        ? "acquired" : "timeout";
            case "write":
                return lock.writeLock().acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS)
                        ? "acquired" : "timeout";
            case "release-read":
                lock.readLock().release();
                return "released";
            case "release-write":
                lock.writeLock().release();
                return "released";
            case "nodes": {
                List<String> children;
                try {
                    children = new ArrayList<>(client.getChildren().forPath(path));
                } catch (KeeperException.NoNodeException e) {
                    children = new ArrayList<>();
                }
                children.sort(null);
                return "nodes " + String.join(",", children);
            }
            default:
                return "error unknown command: " + String.join(" ", cmd);
        }
    }
}
