# Servers the tests need, each installed with apt-get only if missing and
# started on loopback only if not already answering. Sourced by scripts/test.
#
# A service NAME is three functions: NAME_ready (answers now?), NAME_install
# (packages), NAME_start (start it in the background). `ensure NAME` runs
# them in order and waits until NAME_ready, or fails loudly.

APT_UPDATED=0

log() { printf '[servers] %s\n' "$*" >&2; }

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
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        $sudo apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
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

# Where servers we start keep their data and logs.
STATE_DIR=${LOCKSMITH_STATE_DIR:-${TMPDIR:-/tmp}/locksmith-test-servers}
mkdir -p "$STATE_DIR"

# --- the toolchain's own needs -------------------------------------------

# SQLite is bundled into the binary by sqlx; building it needs a C compiler.
build_tools_ready() { command -v cc >/dev/null 2>&1 && command -v cargo >/dev/null 2>&1; }
build_tools_install() {
    apt_install gcc libc6-dev pkg-config
    command -v cargo >/dev/null 2>&1 || { log "cargo is not installed (install Rust with rustup)"; return 1; }
}
build_tools_start() { :; }
