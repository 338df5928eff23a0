# Servers the tests need, each installed with apt-get only if missing and
# started on loopback only if not already answering. Sourced by scripts/test.
#
# A service NAME is three functions: NAME_ready (answers now?), NAME_install
# (packages), NAME_start (start it in the background). `ensure NAME` runs
# them in order and waits until NAME_ready, or fails loudly.

APT_UPDATED=0

log() { printf '[servers] %s\n' "$*" >&2; }

# Reads the package lists once per run, before the first fetch.
apt_update_once() {
    [ "$APT_UPDATED" -eq 0 ] || return 0
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    log "apt-get update"
    $sudo apt-get update -qq >/dev/null
    APT_UPDATED=1
}

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        log "need ${missing[*]} but apt-get is not available; install them by hand"
        return 1
    fi
    apt_update_once
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

wait_for() {
    local name=$1 tries=${2:-60}
    for _ in $(seq "$tries"); do
        "${name}_ready" && return 0
        sleep 0.5
    done
    log "$name did not come up; see its log under ${STATE_DIR}"
    return 1
}

ensure() {
    local name=$1
    if "${name}_ready"; then
        log "$name: already running"
        return 0
    fi
    "${name}_install"
    log "$name: starting"
    "${name}_start"
    wait_for "$name"
    log "$name: ready"
}

# The ports: defaults from scripts/ports.env (which the Rust tests read
# too), each overridable with LOCKWRIGHT_<NAME>.
# shellcheck source=scripts/ports.env
source "$(dirname "${BASH_SOURCE[0]}")/ports.env"

# Where servers we start keep their data and logs.
STATE_DIR=${LOCKWRIGHT_STATE_DIR:-${TMPDIR:-/tmp}/lockwright-test-servers}
mkdir -p "$STATE_DIR"

# --- the toolchain's own needs -------------------------------------------

# SQLite is bundled into the binary by sqlx; building it needs a C compiler.
build_tools_ready() { command -v cc >/dev/null 2>&1 && command -v cargo >/dev/null 2>&1; }
build_tools_install() {
    apt_install gcc libc6-dev pkg-config
    command -v cargo >/dev/null 2>&1 || { log "cargo is not installed (install Rust with rustup)"; return 1; }
}
build_tools_start() { :; }

# --- PostgreSQL (the shared server on 5432) ------------------------------

PG_PORT=${LOCKWRIGHT_PG_PORT:-$PG_PORT}
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }

postgres_ready() { command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p "$PG_PORT"; }
postgres_install() { apt_install postgresql postgresql-client; }
postgres_start() {
    local ver
    ver=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$ver" ]; then
        log "no PostgreSQL cluster configured after install"
        return 1
    fi
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start
}
# The role and database the tests log in with (password auth over TCP);
# the arguments say which server psql talks to.
pg_create_test_db() {
    as_postgres psql -q -v ON_ERROR_STOP=1 "$@" <<'SQL' >/dev/null
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lockwright') THEN
    CREATE ROLE lockwright LOGIN PASSWORD 'lockwright';
  END IF;
END $$;
SELECT 'CREATE DATABASE lockwright_test OWNER lockwright'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'lockwright_test')\gexec
SQL
}
postgres_provision() { pg_create_test_db -p "$PG_PORT"; }

# --- MariaDB (the shared server on 3306) ---------------------------------

MY_PORT=${LOCKWRIGHT_MY_PORT:-$MY_PORT}
mariadb_ready() {
    command -v mariadb-admin >/dev/null 2>&1 &&
        mariadb-admin --protocol=tcp -h 127.0.0.1 -P "$MY_PORT" -u lockwright -plockwright ping >/dev/null 2>&1 ||
        { command -v mariadb-admin >/dev/null 2>&1 && mariadb-admin -uroot ping >/dev/null 2>&1; }
}
mariadb_install() { apt_install mariadb-server mariadb-client; }
mariadb_start() {
    install -d -o mysql -g mysql /run/mysqld
    if [ ! -d /var/lib/mysql/mysql ]; then
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    # setsid and every descriptor redirected: nothing may keep the caller's
    # pipes open (CI waits for them to close).
    setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --port="$MY_PORT" \
        </dev/null >>"$STATE_DIR/mariadb.log" 2>&1 &
}
# The user and database the tests log in with; the arguments say which
# server the client talks to (as root over its socket).
my_create_test_db() {
    mariadb -uroot "$@" <<'SQL'
CREATE DATABASE IF NOT EXISTS lockwright_test CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'lockwright'@'localhost' IDENTIFIED BY 'lockwright';
CREATE USER IF NOT EXISTS 'lockwright'@'127.0.0.1' IDENTIFIED BY 'lockwright';
GRANT ALL PRIVILEGES ON lockwright_test.* TO 'lockwright'@'localhost';
GRANT ALL PRIVILEGES ON lockwright_test.* TO 'lockwright'@'127.0.0.1';
SQL
}
mariadb_provision() { my_create_test_db; }

# --- private instances the outage tests stop and restart ----------------
# They run on their own ports and data directories, so stopping them never
# disturbs the shared servers other tests use.

PG_FAULT_PORT=${LOCKWRIGHT_PG_FAULT_PORT:-$PG_FAULT_PORT}
PG_FAULT_DIR="$STATE_DIR/pg-fault"
pg_fault_ready() { pg_isready -q -h 127.0.0.1 -p "$PG_FAULT_PORT" 2>/dev/null; }
pg_fault_install() { postgres_install; }
pg_fault_start() {
    local bin
    bin=$(pg_bin)
    install -d -o postgres -g postgres "$PG_FAULT_DIR"
    if [ ! -f "$PG_FAULT_DIR/data/PG_VERSION" ]; then
        as_postgres "$bin/initdb" -D "$PG_FAULT_DIR/data" -U postgres --auth=trust >/dev/null
    fi
    as_postgres "$bin/pg_ctl" -D "$PG_FAULT_DIR/data" -l "$PG_FAULT_DIR/log" -w \
        -o "-p $PG_FAULT_PORT -c listen_addresses=127.0.0.1 -k $PG_FAULT_DIR" start >/dev/null
    pg_create_test_db -h 127.0.0.1 -p "$PG_FAULT_PORT" -U postgres
}
pg_fault_stop() {
    [ -f "$PG_FAULT_DIR/data/postmaster.pid" ] || return 0
    as_postgres "$(pg_bin)/pg_ctl" -D "$PG_FAULT_DIR/data" -m immediate -w stop >/dev/null
}

MY_FAULT_PORT=${LOCKWRIGHT_MY_FAULT_PORT:-$MY_FAULT_PORT}
MY_FAULT_DIR="$STATE_DIR/my-fault"
my_fault_ready() {
    mariadb-admin --protocol=tcp -h 127.0.0.1 -P "$MY_FAULT_PORT" -u lockwright -plockwright ping >/dev/null 2>&1
}
my_fault_install() { mariadb_install; }
my_fault_start() {
    install -d -o mysql -g mysql "$MY_FAULT_DIR"
    local fresh=0
    if [ ! -d "$MY_FAULT_DIR/data/mysql" ]; then
        mariadb-install-db --user=mysql --datadir="$MY_FAULT_DIR/data" \
            --auth-root-authentication-method=normal >/dev/null
        fresh=1
    fi
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$MY_FAULT_DIR/data" \
        --port="$MY_FAULT_PORT" --bind-address=127.0.0.1 --socket="$MY_FAULT_DIR/sock" \
        --pid-file="$MY_FAULT_DIR/pid" --skip-name-resolve \
        </dev/null >>"$MY_FAULT_DIR/log" 2>&1 &
    for _ in $(seq 60); do
        mariadb-admin --socket="$MY_FAULT_DIR/sock" -uroot ping >/dev/null 2>&1 && break
        sleep 0.5
    done
    if [ "$fresh" -eq 1 ] || ! my_fault_ready; then
        my_create_test_db --socket="$MY_FAULT_DIR/sock"
    fi
}
my_fault_stop() {
    [ -f "$MY_FAULT_DIR/pid" ] || return 0
    local pid
    pid=$(cat "$MY_FAULT_DIR/pid")
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    rm -f "$MY_FAULT_DIR/pid"
}

# --- Redis: the shared server, and five independent Redlock masters -------

REDIS_PORT=${LOCKWRIGHT_REDIS_PORT:-$REDIS_PORT}
REDLOCK_PORTS=${LOCKWRIGHT_REDLOCK_PORTS:-$REDLOCK_PORTS}

redis_port_ready() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }
redis_start_port() {
    mkdir -p "$STATE_DIR/redis-$1"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$1" --save "" --appendonly no \
        --dir "$STATE_DIR/redis-$1" --logfile "$STATE_DIR/redis-$1/log" </dev/null >/dev/null
}

# openssl makes the certificates of the TLS test's private server.
redis_ready() {
    command -v redis-cli >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 &&
        redis_port_ready "$REDIS_PORT"
}
redis_install() { apt_install redis-server redis-tools openssl; }
redis_start() { redis_start_port "$REDIS_PORT"; }

redlock_ready() {
    command -v redis-cli >/dev/null 2>&1 || return 1
    for p in $REDLOCK_PORTS; do redis_port_ready "$p" || return 1; done
}
redlock_install() { redis_install; }
redlock_start() {
    for p in $REDLOCK_PORTS; do redis_port_ready "$p" || redis_start_port "$p"; done
}

# The private server the outage tests stop. It keeps nothing on disk, so a
# restart forgets every lock, as a real Redis without persistence would.
REDIS_FAULT_PORT=${LOCKWRIGHT_REDIS_FAULT_PORT:-$REDIS_FAULT_PORT}
redis_fault_ready() { command -v redis-cli >/dev/null 2>&1 && redis_port_ready "$REDIS_FAULT_PORT"; }
redis_fault_install() { redis_install; }
redis_fault_start() { redis_start_port "$REDIS_FAULT_PORT"; }
redis_fault_stop() {
    pkill -9 -f -- "redis-server 127.0.0.1:$REDIS_FAULT_PORT\$" 2>/dev/null || true
    for _ in $(seq 40); do redis_port_ready "$REDIS_FAULT_PORT" || break; sleep 0.25; done
}

# --- Redis as run in production: under Sentinel, and as a Cluster ---------
#
# Debian's redis-server run by hand: `--sentinel` makes it a sentinel (the
# redis-sentinel package would start a service of its own on 26379). Both
# setups are test data: a setup that is not whole is wiped and made anew.

REDIS_SENTINEL_DATA_PORTS=${LOCKWRIGHT_REDIS_SENTINEL_DATA_PORTS:-$REDIS_SENTINEL_DATA_PORTS}
REDIS_SENTINEL_PORTS=${LOCKWRIGHT_REDIS_SENTINEL_PORTS:-$REDIS_SENTINEL_PORTS}
REDIS_CLUSTER_PORTS=${LOCKWRIGHT_REDIS_CLUSTER_PORTS:-$REDIS_CLUSTER_PORTS}
SENTINEL_DIR="$STATE_DIR/redis-sentinel"
CLUSTER_DIR="$STATE_DIR/redis-cluster"

# Stops every redis-server whose working directory is under $1.
redis_kill_under() {
    local pid
    for pid in $(pgrep -x redis-server 2>/dev/null) $(pgrep -f 'redis-server .*\[sentinel\]' 2>/dev/null); do
        case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in
            "$1"/*) kill -9 "$pid" 2>/dev/null || true ;;
        esac
    done
}

# Whole: every data node and sentinel answers, each sentinel names a
# primary, and that node is a master with two replicas online.
redis_sentinel_ready() {
    command -v redis-cli >/dev/null 2>&1 || return 1
    local p addr primary=""
    for p in $REDIS_SENTINEL_DATA_PORTS $REDIS_SENTINEL_PORTS; do redis_port_ready "$p" || return 1; done
    for p in $REDIS_SENTINEL_PORTS; do
        addr=$(redis-cli -h 127.0.0.1 -p "$p" sentinel get-master-addr-by-name lockwright 2>/dev/null | tail -1)
        [ -n "$addr" ] || return 1
        [ -z "$primary" ] || [ "$primary" = "$addr" ] || return 1
        primary=$addr
    done
    redis-cli -h 127.0.0.1 -p "$primary" info replication 2>/dev/null | tr -d '\r' |
        grep -qx 'connected_slaves:2' &&
        redis-cli -h 127.0.0.1 -p "$primary" role 2>/dev/null | head -1 | grep -qx master
}
redis_sentinel_install() { redis_install; }
redis_sentinel_start() {
    redis_kill_under "$SENTINEL_DIR"
    rm -rf "$SENTINEL_DIR"
    local p primary="" dir
    for p in $REDIS_SENTINEL_DATA_PORTS; do
        dir="$SENTINEL_DIR/data-$p"
        mkdir -p "$dir"
        if [ -z "$primary" ]; then
            primary=$p
            set -- --port "$p"
        else
            set -- --port "$p" --replicaof 127.0.0.1 "$primary"
        fi
        (cd "$dir" && redis-server --daemonize yes --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$dir" --logfile "$dir/log" "$@" </dev/null >/dev/null)
    done
    for p in $REDIS_SENTINEL_PORTS; do
        dir="$SENTINEL_DIR/sentinel-$p"
        mkdir -p "$dir"
        # Sentinels rewrite their file as they learn: one each, writable.
        cat >"$dir/sentinel.conf" <<CONF
port $p
bind 127.0.0.1
daemonize yes
dir $dir
logfile $dir/log
sentinel announce-ip 127.0.0.1
sentinel monitor lockwright 127.0.0.1 $primary 2
sentinel down-after-milliseconds lockwright 1000
sentinel failover-timeout lockwright 5000
sentinel parallel-syncs lockwright 1
CONF
        (cd "$dir" && redis-server "$dir/sentinel.conf" --sentinel </dev/null >/dev/null)
    done
}
redis_sentinel_stop() { redis_kill_under "$SENTINEL_DIR"; }

# Whole: the cluster says ok and knows its six nodes.
redis_cluster_ready() {
    command -v redis-cli >/dev/null 2>&1 || return 1
    local p info
    for p in $REDIS_CLUSTER_PORTS; do redis_port_ready "$p" || return 1; done
    set -- $REDIS_CLUSTER_PORTS
    info=$(redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r')
    echo "$info" | grep -qx 'cluster_state:ok' && echo "$info" | grep -qx 'cluster_known_nodes:6'
}
redis_cluster_install() { redis_install; }
redis_cluster_start() {
    redis_kill_under "$CLUSTER_DIR"
    rm -rf "$CLUSTER_DIR"
    local p dir nodes=""
    for p in $REDIS_CLUSTER_PORTS; do
        dir="$CLUSTER_DIR/node-$p"
        mkdir -p "$dir"
        (cd "$dir" && redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --save "" \
            --appendonly no --dir "$dir" --logfile "$dir/log" --cluster-enabled yes \
            --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 2000 </dev/null >/dev/null)
        nodes="$nodes 127.0.0.1:$p"
    done
    for p in $REDIS_CLUSTER_PORTS; do
        for _ in $(seq 100); do redis_port_ready "$p" && break; sleep 0.1; done
    done
    # shellcheck disable=SC2086
    redis-cli --cluster create $nodes --cluster-replicas 1 --cluster-yes >"$CLUSTER_DIR/create.log" 2>&1
}
redis_cluster_stop() { redis_kill_under "$CLUSTER_DIR"; }

# --- ZooKeeper: a standalone server, and a private 3-node ensemble ---------
#
# Debian's `zookeeper` package (never `zookeeperd`, whose service would take
# the ports), run by hand with short ticks so that session expiry takes
# seconds, containers reaped every second, no fsync (test data only), and
# the admin server off (it takes port 8080 otherwise). Curator's jars are
# for the interop test, which runs a Java source file (it needs javac's
# module, so a JDK).

ZK_PORT=${LOCKWRIGHT_ZK_PORT:-$ZK_PORT}
ZK_ENSEMBLE_PORTS=${LOCKWRIGHT_ZK_ENSEMBLE_PORTS:-$ZK_ENSEMBLE_PORTS}
ZK_CP=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar

# The server's mode as its `srvr` command tells it: standalone, leader or follower.
zk_mode() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf srvr >&3 && cat <&3" 2>/dev/null |
        sed -n 's/^Mode: //p'
}
zk_install() {
    apt_install zookeeper libcurator-recipes-java libslf4j-java
    java --list-modules 2>/dev/null | grep -q '^jdk.compiler' || apt_install default-jdk-headless
}
# $1: directory; the rest: zoo.cfg lines beyond the common ones.
zk_run() {
    local dir=$1
    shift
    mkdir -p "$dir/data"
    {
        echo "dataDir=$dir/data"
        echo "clientPortAddress=127.0.0.1"
        echo "admin.enableServer=false"
        echo "forceSync=no"
        echo "maxSessionTimeout=60000"
        echo "4lw.commands.whitelist=srvr,ruok,mntr"
        printf '%s\n' "$@"
    } >"$dir/zoo.cfg"
    setsid java -Xmx256m -XX:+UseSerialGC -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
        -Dznode.container.checkIntervalMs=1000 -Dznode.container.maxPerMinute=1000000 \
        -cp "$ZK_CP" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
        </dev/null >>"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
}
# Kills the server of $1 by its config path (a pid file can be stale).
zk_kill() {
    local dir=$1
    pkill -9 -f -- "QuorumPeerMain $dir/zoo.cfg" 2>/dev/null || true
    for _ in $(seq 40); do
        pgrep -f -- "QuorumPeerMain $dir/zoo.cfg" >/dev/null 2>&1 || break
        sleep 0.25
    done
    rm -f "$dir/pid"
}
# Whether the server of $1 runs, serving or not (a node cut off from its
# quorum still runs): never start a second copy over it.
zk_running() { pgrep -f -- "QuorumPeerMain $1/zoo.cfg" >/dev/null 2>&1; }
# Answers at all (`ruok`), in a quorum or not.
zk_alive() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf ruok >&3 && cat <&3" 2>/dev/null |
        grep -q imok
}

zookeeper_ready() {
    [ -f /usr/share/java/curator-recipes.jar ] &&
        java --list-modules 2>/dev/null | grep -q '^jdk.compiler' &&
        [ -n "$(zk_mode "$ZK_PORT")" ]
}
zookeeper_install() { zk_install; }
zookeeper_start() {
    zk_running "$STATE_DIR/zk" && return 0
    zk_run "$STATE_DIR/zk" "tickTime=100" "minSessionTimeout=200" "clientPort=$ZK_PORT"
}

# Ensemble node N (1, 2 or 3): the Nth client port of ZK_ENSEMBLE_PORTS,
# peer ports 2288N and 2388N.
zk_node_dir() { echo "$STATE_DIR/zk-ensemble/$1"; }
zk_node_port() { set -- "$1" $ZK_ENSEMBLE_PORTS; shift "$1"; echo "$1"; }
zk_node_start() {
    local dir
    dir=$(zk_node_dir "$1")
    zk_running "$dir" && return 0
    mkdir -p "$dir/data"
    echo "$1" >"$dir/data/myid"
    zk_run "$dir" "tickTime=200" "minSessionTimeout=400" "initLimit=20" "syncLimit=10" \
        "clientPort=$(zk_node_port "$1")" "server.1=127.0.0.1:22881:23881" \
        "server.2=127.0.0.1:22882:23882" "server.3=127.0.0.1:22883:23883"
}
zk_node_stop() { zk_kill "$(zk_node_dir "$1")"; }
# A node alone is "ready" once it runs and answers; it serves only in a
# quorum, which zk_ensemble_ready waits for.
for n in 1 2 3; do
    eval "zk$n""_ready() { zk_alive \"\$(zk_node_port $n)\"; }"
    eval "zk$n""_install() { zk_install; }"
    eval "zk$n""_start() { zk_node_start $n; }"
    eval "zk$n""_stop() { zk_node_stop $n; }"
done
# The ensemble serves once every node knows its role.
zk_ensemble_ready() {
    for p in $ZK_ENSEMBLE_PORTS; do
        case "$(zk_mode "$p")" in leader | follower) ;; *) return 1 ;; esac
    done
}
zk_ensemble_install() { zk_install; }
zk_ensemble_start() {
    for n in 1 2 3; do "zk${n}_ready" || zk_node_start "$n"; done
}

# --- etcd: a single member, and a private 3-member cluster ----------------
#
# Debian's `etcd-server` run by hand (its packaged service is not used: it
# would take the default ports), on ports of its own, with the default
# heartbeat (100 ms) and election timeout (1 s). `etcd-client` is etcdctl,
# which the interop tests drive as Go's `concurrency` package's own user;
# protoc (and protobuf's own .proto files) is what the `etcd-client`
# crate's build generates its gRPC code with.
# openssl makes the certificates of the TLS test's private member.

ETCD_PORT=${LOCKWRIGHT_ETCD_PORT:-$ETCD_PORT}
ETCD_CLUSTER_PORTS=${LOCKWRIGHT_ETCD_CLUSTER_PORTS:-$ETCD_CLUSTER_PORTS}

etcd_install() { apt_install etcd-server etcd-client protobuf-compiler libprotobuf-dev openssl; }
# Healthy: the member answers a read that needs its cluster's quorum.
etcd_port_ready() {
    command -v etcdctl >/dev/null 2>&1 &&
        ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$1" --command-timeout 2s \
            endpoint health >/dev/null 2>&1
}
# Whether the member of $1 (its data directory) runs, serving or not.
etcd_running() { pgrep -f -- "etcd --name [^ ]* --data-dir $1 " >/dev/null 2>&1; }
# $1: directory, $2: name, $3: client port; the rest: flags beyond the common ones.
etcd_run() {
    local dir=$1 name=$2 port=$3
    shift 3
    mkdir -p "$dir"
    setsid etcd --name "$name" --data-dir "$dir/data" \
        --listen-client-urls "http://127.0.0.1:$port" \
        --advertise-client-urls "http://127.0.0.1:$port" \
        --heartbeat-interval 100 --election-timeout 1000 --log-level warn "$@" \
        </dev/null >>"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
}
# Answers at all (its own status, which needs no quorum).
etcd_alive() {
    command -v etcdctl >/dev/null 2>&1 &&
        ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$1" --command-timeout 2s \
            endpoint status >/dev/null 2>&1
}
etcd_kill() {
    local dir=$1
    pkill -9 -f -- "etcd --name [^ ]* --data-dir $dir/data " 2>/dev/null || true
    for _ in $(seq 40); do
        etcd_running "$dir/data" || break
        sleep 0.25
    done
    rm -f "$dir/pid"
}

etcd_ready() { etcd_port_ready "$ETCD_PORT"; }
etcd_start() {
    local dir="$STATE_DIR/etcd"
    etcd_running "$dir/data" && return 0
    etcd_run "$dir" single "$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
        --initial-cluster "single=http://127.0.0.1:$((ETCD_PORT + 1))"
}

# Cluster member N (1, 2 or 3): the Nth client port of ETCD_CLUSTER_PORTS.
etcd_node_dir() { echo "$STATE_DIR/etcd-cluster/$1"; }
etcd_node_port() { set -- "$1" $ETCD_CLUSTER_PORTS; shift "$1"; echo "$1"; }
etcd_node_start() {
    local dir port peers="" n p
    dir=$(etcd_node_dir "$1")
    etcd_running "$dir/data" && return 0
    port=$(etcd_node_port "$1")
    for n in 1 2 3; do
        p=$(etcd_node_port "$n")
        peers="$peers${peers:+,}e$n=http://127.0.0.1:$((p + 1))"
    done
    # The cluster's flags count only on a member's first start; a restart
    # finds its data directory and rejoins.
    etcd_run "$dir" "e$1" "$port" \
        --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
        --initial-cluster "$peers" --initial-cluster-token lockwright-test \
        --initial-cluster-state new
}
etcd_node_stop() { etcd_kill "$(etcd_node_dir "$1")"; }
# A member alone is "ready" once it runs and answers (it serves only in a
# quorum, which etcd_cluster_ready waits for).
for n in 1 2 3; do
    eval "etcd$n""_ready() { etcd_alive \"\$(etcd_node_port $n)\"; }"
    eval "etcd$n""_install() { etcd_install; }"
    eval "etcd$n""_start() { etcd_node_start $n; }"
    eval "etcd$n""_stop() { etcd_node_stop $n; }"
done
etcd_cluster_ready() {
    for p in $ETCD_CLUSTER_PORTS; do etcd_port_ready "$p" || return 1; done
}
etcd_cluster_install() { etcd_install; }
# All three at once: each waits for the others to form its first quorum.
etcd_cluster_start() {
    for n in 1 2 3; do etcd_node_start "$n"; done
}

# --- memcached: the shared server, and three private ones for the quorum ----
#
# Debian's `memcached`, run by hand (its packaged service is not used), with
# -M so that a full server refuses writes instead of evicting held locks.

MC_PORT=${LOCKWRIGHT_MC_PORT:-$MC_PORT}
MC_QUORUM_PORTS=${LOCKWRIGHT_MC_QUORUM_PORTS:-$MC_QUORUM_PORTS}

mc_port_ready() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'mn\r\n' >&3 && head -c 2 <&3" 2>/dev/null | grep -q MN; }
mc_start_port() {
    local user=nobody
    id memcache >/dev/null 2>&1 && user=memcache
    # -M: refuse writes rather than evict; no_slab_reassign: no page mover
    # dropping items it cannot move (what the README asks of a lock server).
    memcached -d -u "$user" -l 127.0.0.1 -p "$1" -U 0 -M -m 64 -o no_slab_reassign
}
memcached_ready() { command -v memcached >/dev/null 2>&1 && mc_port_ready "$MC_PORT"; }
memcached_install() { apt_install memcached; }
memcached_start() { mc_start_port "$MC_PORT"; }

mc_quorum_ready() {
    command -v memcached >/dev/null 2>&1 || return 1
    for p in $MC_QUORUM_PORTS; do mc_port_ready "$p" || return 1; done
}
mc_quorum_install() { memcached_install; }
mc_quorum_start() {
    for p in $MC_QUORUM_PORTS; do mc_port_ready "$p" || mc_start_port "$p"; done
}

# A private server the outage test stops and restarts.
MC_FAULT_PORT=${LOCKWRIGHT_MC_FAULT_PORT:-$MC_FAULT_PORT}
mc_fault_ready() { command -v memcached >/dev/null 2>&1 && mc_port_ready "$MC_FAULT_PORT"; }
mc_fault_install() { memcached_install; }
mc_fault_start() { mc_start_port "$MC_FAULT_PORT"; }
# Killed by its command line (it drops root before it could write a pid
# file into our directory).
mc_fault_stop() {
    pkill -9 -f -- "memcached .*-p $MC_FAULT_PORT " 2>/dev/null || true
    for _ in $(seq 40); do mc_port_ready "$MC_FAULT_PORT" || break; sleep 0.25; done
}

# --- promtool: checks contrib/'s Prometheus rules (no server) --------------

# Debian's `prometheus` package carries promtool, but installing it would
# also start a Prometheus server (on every interface) where services start
# on install. So the package is only unpacked into the state directory,
# unless a promtool is already on the PATH.
PROMTOOL=$(command -v promtool 2>/dev/null || echo "$STATE_DIR/prometheus/usr/bin/promtool")
promtool_ready() { [ -x "$PROMTOOL" ]; }
promtool_install() {
    [ -x "$PROMTOOL" ] && return 0
    command -v apt-get >/dev/null 2>&1 || { log "promtool: apt-get is not available; put promtool on the PATH"; return 1; }
    apt_update_once
    local dir
    dir=$(mktemp -d)
    log "promtool: unpacking Debian's prometheus package into $STATE_DIR/prometheus"
    local ok=0
    (cd "$dir" && apt-get download -qq prometheus >/dev/null 2>&1) &&
        dpkg-deb -x "$dir"/prometheus_*.deb "$STATE_DIR/prometheus" || ok=1
    rm -rf "$dir"
    [ "$ok" -eq 0 ] || log "promtool: could not fetch Debian's prometheus package; put promtool on the PATH"
    return "$ok"
}
promtool_start() { :; }
