#!/usr/bin/env bash
# Build the container base image locally, without pulling anything from a
# registry.
#
# Why this exists: some machines (ours included) run a Docker engine that
# cannot pull any image from a registry, so `FROM debian:bookworm-slim` never
# resolves there. The multi-stage Dockerfile meant for people who do have a
# registry keeps using debian:bookworm-slim; this script is the way to get an
# equivalent base everywhere else. It builds a Debian root filesystem with
# debootstrap (variant minbase, same suite as the host so that binaries built
# on the host find the same glibc), adds what the runtime needs in the
# container (CA certificates, headless Chromium, a font), creates the
# unprivileged user `agentry`, and loads the result with `docker import`.
#
# How it is used: the compose file builds from docker/Dockerfile.local, which
# starts with `FROM ${BASE_IMAGE}` (this image, agentry-base:local by default)
# and copies in the binaries built on the host. Run this script once before
# `docker-compose build`; running it again is cheap, because the image carries
# a label with a hash of its recipe and is rebuilt only when the recipe
# changes (or with --force).
#
# Usage: docker/base-image.sh [--force] [--help]
#
# Environment:
#   AGENTRY_BASE_IMAGE  image tag to build (default agentry-base:local)
#   DEBIAN_SUITE        Debian suite (default: VERSION_CODENAME of the host)
#   DEBIAN_MIRROR       Debian mirror (default: taken from the host's apt
#                       sources, the entry that lists the suite)
#   TMPDIR              where the temporary root filesystem goes (default
#                       /var/tmp; needs about 1 GB free)
#
# Must run as root (debootstrap and chroot need it).

set -euo pipefail

readonly IMAGE=${AGENTRY_BASE_IMAGE:-agentry-base:local}
readonly RECIPE_LABEL=org.agentry.base-recipe
readonly AGENTRY_UID=10001
readonly AGENTRY_GID=10001

# What goes into the image besides the minbase system. debootstrap resolves
# their dependencies (Depends only, never Recommends) but not virtual
# packages: GTK's dconf backend, which chromium pulls in, needs some
# "dbus-session-bus", and dbus-x11 is the smallest package providing one
# (the other, dbus-user-session, brings systemd along).
readonly PACKAGES=(
    ca-certificates
    chromium
    fonts-liberation
    dbus-x11
    git
    postgresql
)

# How the check below runs Chromium in the container as user agentry.
# --no-sandbox is required: the image has no setuid sandbox helper and
# Docker's default seccomp profile denies the user namespaces Chromium's own
# sandbox needs. --disable-gpu only spares a GPU-process error in the log.
# (Messages about D-Bus on stderr are harmless.)
readonly CHROMIUM_FLAGS=(--headless --no-sandbox --disable-gpu)

SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
readonly SCRIPT_PATH

log() { printf '==> %s\n' "$*"; }
die() { printf 'base-image.sh: error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<EOF
Usage: $(basename "$0") [--force] [--help]

Builds the Docker base image ${IMAGE} from a Debian root filesystem made with
debootstrap and loaded with 'docker import' (no registry needed).

  --force   rebuild even if an image with the same recipe already exists
  --help    show this help

Environment: AGENTRY_BASE_IMAGE, DEBIAN_SUITE, DEBIAN_MIRROR, TMPDIR.
Must run as root.
EOF
}

force=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $arg" ;;
    esac
done

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap and chroot need it); try: sudo $0 $*"
command -v docker >/dev/null || die "docker is not installed"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker engine (is it running?)"

# --- Suite -----------------------------------------------------------------

host_codename() {
    # shellcheck disable=SC1091
    (. /etc/os-release && printf '%s\n' "${VERSION_CODENAME:-}")
}

suite=${DEBIAN_SUITE:-}
if [[ -z $suite ]]; then
    [[ -r /etc/os-release ]] || die "no /etc/os-release; set DEBIAN_SUITE"
    if ! grep -qsE '^ID="?debian"?$' /etc/os-release; then
        die "the host is not Debian, so its codename is not a Debian suite; set DEBIAN_SUITE (and DEBIAN_MIRROR)"
    fi
    suite=$(host_codename)
    [[ -n $suite ]] || die "no VERSION_CODENAME in /etc/os-release; set DEBIAN_SUITE"
fi
[[ $suite =~ ^[a-z][a-z0-9-]*$ ]] || die "odd Debian suite name: '$suite'"

arch=$(dpkg --print-architecture 2>/dev/null || uname -m)

# --- Recipe hash and cache check -------------------------------------------

recipe=$({
    cat "$SCRIPT_PATH"
    printf 'suite=%s\narch=%s\npackages=%s\n' "$suite" "$arch" "${PACKAGES[*]}"
} | sha256sum | cut -d' ' -f1)

current=$(docker image inspect --format "{{ index .Config.Labels \"$RECIPE_LABEL\" }}" "$IMAGE" 2>/dev/null || true)
[[ $current != "<no value>" ]] || current=
old_id=$(docker image inspect --format '{{ .Id }}' "$IMAGE" 2>/dev/null || true)

if [[ $force -eq 0 && $current == "$recipe" ]]; then
    log "$IMAGE is up to date (recipe ${recipe:0:12}); nothing to do (--force rebuilds)"
    exit 0
fi

if [[ -n $old_id ]]; then
    if [[ $force -eq 1 ]]; then
        log "rebuilding $IMAGE (--force)"
    else
        was=${current:0:12}
        log "rebuilding $IMAGE: recipe changed (${was:-no recipe label} -> ${recipe:0:12})"
    fi
else
    log "building $IMAGE (recipe ${recipe:0:12})"
fi

# --- Mirror ----------------------------------------------------------------

# Prints the URIs of deb822 entries (Types: deb) whose Suites list the suite.
uris_from_deb822() {
    local want=$1; shift
    awk -v want="$want" '
        function flush(   n, i, s, u) {
            if (types ~ /(^|[[:space:]])deb([[:space:]]|$)/ && enabled != "no") {
                n = split(suites, s, /[[:space:]]+/)
                for (i = 1; i <= n; i++) if (s[i] == want) break
                if (i <= n) {
                    n = split(uris, u, /[[:space:]]+/)
                    for (i = 1; i <= n; i++) if (u[i] != "") print u[i]
                }
            }
            types = suites = uris = enabled = field = ""
        }
        FNR == 1 { flush() }
        /^[[:space:]]*#/ { next }
        /^[[:space:]]*$/ { flush(); next }
        /^[[:space:]]/ {                       # continuation line
            if (field == "types") types = types " " $0
            else if (field == "suites") suites = suites " " $0
            else if (field == "uris") uris = uris " " $0
            next
        }
        {
            field = tolower(substr($0, 1, index($0, ":") - 1))
            value = substr($0, index($0, ":") + 1)
            if (field == "types") types = value
            else if (field == "suites") suites = value
            else if (field == "uris") uris = value
            else if (field == "enabled") { enabled = tolower(value); gsub(/[[:space:]]/, "", enabled) }
        }
        END { flush() }
    ' "$@"
}

# Prints the URIs of one-line entries `deb [options] URI suite component...`.
uris_from_list() {
    local want=$1; shift
    awk -v want="$want" '
        {
            sub(/#.*/, "")
            n = split($0, f, /[[:space:]]+/)
            k = 0; inopt = 0
            for (i = 1; i <= n; i++) {
                if (f[i] == "") continue
                if (k == 1 && (inopt || f[i] ~ /^\[/)) {   # [ option=value ... ]
                    inopt = (f[i] !~ /\]$/)
                    continue
                }
                t[++k] = f[i]
            }
            if (k >= 3 && t[1] == "deb" && t[3] == want) print t[2]
        }
    ' "$@"
}

find_mirror() {
    local want=$1 uri
    local -a sources=() lists=()
    shopt -s nullglob
    sources=(/etc/apt/sources.list.d/*.sources)
    lists=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list)
    shopt -u nullglob
    local -a existing=()
    for f in "${lists[@]}"; do [[ -r $f ]] && existing+=("$f"); done
    local -a uris=()
    if ((${#sources[@]})); then mapfile -t -O 0 uris < <(uris_from_deb822 "$want" "${sources[@]}"); fi
    if ((${#existing[@]})); then mapfile -t -O "${#uris[@]}" uris < <(uris_from_list "$want" "${existing[@]}"); fi
    for uri in "${uris[@]}"; do
        # debootstrap can fetch from these; apt-only schemes (mirror+, tor+,
        # cdrom:) are skipped.
        if [[ $uri =~ ^(https?|file): ]]; then
            printf '%s\n' "${uri%/}"
            return 0
        fi
    done
}

mirror=${DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
    mirror=$(find_mirror "$suite")
    [[ -n $mirror ]] || die "no apt source for suite '$suite' in /etc/apt/sources.list or /etc/apt/sources.list.d/; set DEBIAN_MIRROR to a Debian mirror URL"
fi
log "suite $suite ($arch), mirror $mirror"

# --- debootstrap on the host -----------------------------------------------

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap on the host"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring gpgv >/dev/null
fi

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r $keyring ]] || die "missing $keyring (apt-get install debian-archive-keyring)"

# --- Root filesystem -------------------------------------------------------

start=$SECONDS
rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/agentry-base.XXXXXX")

cleanup() {
    local status=$? m
    # debootstrap mounts /proc and /sys inside the target and normally
    # unmounts them; make sure nothing is left before deleting the tree.
    if [[ -n ${rootfs:-} && -d $rootfs ]]; then
        while read -r m; do
            umount -l "$m" 2>/dev/null || true
        done < <(awk -v r="$rootfs" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r)
        rm -rf --one-file-system "$rootfs"
        rm -f "$rootfs.log"
    fi
    # An imported image that failed its checks is not kept.
    if [[ -n ${new_id:-} && -z ${new_id_ok:-} ]]; then
        docker rmi "$new_id" >/dev/null 2>&1 || true
    fi
    if [[ $status -ne 0 ]]; then
        printf 'base-image.sh: failed (exit %d); %s was not changed\n' "$status" "$IMAGE" >&2
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "debootstrap --variant=minbase $suite into $rootfs"
include=$(IFS=,; printf '%s' "${PACKAGES[*]}")
if ! debootstrap --variant=minbase --arch="$arch" --keyring="$keyring" \
    --include="$include" "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
    tail -n 30 "$rootfs.log" >&2
    [[ -r $rootfs/debootstrap/debootstrap.log ]] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
    die "debootstrap failed (see above)"
fi
rm -f "$rootfs.log"
log "debootstrap done in $((SECONDS - start))s"

in_root() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

log "creating user agentry ($AGENTRY_UID:$AGENTRY_GID), /data and /workspace"
in_root groupadd --gid "$AGENTRY_GID" agentry
in_root useradd --uid "$AGENTRY_UID" --gid "$AGENTRY_GID" --create-home \
    --home-dir /home/agentry --shell /bin/bash agentry
install -d -m 0755 -o "$AGENTRY_UID" -g "$AGENTRY_GID" "$rootfs/data" "$rootfs/workspace"

# The PostgreSQL package made a cluster of its own at install time; the
# postgres image (Compose's `postgres` profile) makes its data directory at
# first start instead.
rm -rf "$rootfs"/var/lib/postgresql/*/main "$rootfs"/etc/postgresql/*/main
install -d -m 0700 "$rootfs/var/lib/postgresql/data"
in_root chown postgres:postgres /var/lib/postgresql/data

log "trimming the root filesystem"
in_root apt-get clean
# Keep later `apt-get install`s (in derived images) from bringing docs,
# manuals and translations back, as the slim Debian images do.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/agentry-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$rootfs/etc/apt/apt.conf.d/agentry-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
EOF
(
    cd "$rootfs"
    rm -rf var/lib/apt/lists/* var/cache/apt/* var/cache/debconf/*-old \
        var/lib/dpkg/*-old var/log/* var/cache/ldconfig/aux-cache \
        usr/share/man/* usr/share/info/* usr/share/groff/* usr/share/lintian/*
    # Licences stay; the rest of the documentation goes.
    find usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
    find usr/share/doc -mindepth 1 -type d -empty -delete
    find usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    # Chromium's UI strings: the container runs with LANG=C.UTF-8, which is
    # served by en-US.
    if [[ -d usr/lib/chromium/locales ]]; then
        find usr/lib/chromium/locales -name '*.pak' ! -name 'en-US.pak' -delete
    fi
    # Docker provides these at run time; do not ship the host's.
    : >etc/resolv.conf
    : >etc/hostname
    if [[ -e etc/machine-id ]]; then : >etc/machine-id; fi
    rm -rf dev/* debootstrap
)
size=$(du -sh --one-file-system "$rootfs" | cut -f1)
log "root filesystem: $size"

# --- Import and check -------------------------------------------------------

# Import untagged first; the tag moves only once the image passed the checks.
log "importing into docker"
new_id=$(tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change "LABEL $RECIPE_LABEL=$recipe" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /home/agentry' \
    --change 'CMD ["bash"]' \
    --message "agentry base: debian $suite minbase + ${PACKAGES[*]}" \
    - | tail -n 1)
[[ $new_id == sha256:* ]] || die "docker import printed no image id: $new_id"

log "checking the image"
docker run --rm "$new_id" id agentry
[[ $(docker run --rm "$new_id" sh -c 'ls /etc/ssl/certs | wc -l') -gt 10 ]] ||
    die "the image has no CA certificates in /etc/ssl/certs"
dom=$(docker run --rm --user agentry "$new_id" \
    chromium "${CHROMIUM_FLAGS[@]}" --dump-dom 'data:text/html,<p>hi</p>' 2>/dev/null) ||
    die "headless chromium failed in the image"
[[ $dom == *'<p>hi</p>'* ]] || die "headless chromium printed an unexpected DOM: $dom"
log "headless chromium works as user agentry"
new_id_ok=1

docker tag "$new_id" "$IMAGE"
# The previous image under this tag is now untagged; drop it unless a
# container still uses it.
if [[ -n $old_id && $old_id != "$new_id" ]]; then
    docker rmi "$old_id" >/dev/null 2>&1 || true
fi

log "built $IMAGE in $((SECONDS - start))s: root filesystem $size, image $(docker image inspect --format '{{ .Size }}' "$IMAGE" | numfmt --to=si)B"
