#!/bin/sh
# meson install into a temporary DESTDIR, then check the tree an operator or packager gets.
# Usage: test-install.sh MESON BUILD_DIR CHECK...
# Each CHECK is KIND:PATH[:ARG] with PATH absolute as installed (prefix included):
#   exe:PATH            an executable regular file
#   file:PATH           a regular file
#   same:PATH:SOURCE    a regular file with exactly SOURCE's content
#   unit:PATH:PROGRAM   a systemd unit whose ExecStart runs PROGRAM and whose file://
#                       Documentation= is installed
#   lib:PATH:SONAME     a shared library whose SONAME is SONAME, installed under that name too
#   link:PCDIR:NAME     a program built against the staged tree through NAME.pc in PCDIR (with
#                       $CC $CFLAGS and pkg-config) runs and prints aqua_version(): header, .pc
#                       file, library and its exports fit together
set -eu

meson=$1
build=$2
shift 2

destdir=$(mktemp -d)
trap 'rm -rf "$destdir"' EXIT

# --no-rebuild: the test runs the tree the suite was built from; --quiet keeps the log short.
if ! out=$("$meson" install -C "$build" --destdir "$destdir" --no-rebuild --quiet 2>&1); then
        echo "FAIL: meson install --destdir failed:"
        echo "$out"
        exit 1
fi

failed=0
fail() {
        echo "FAIL: $*"
        failed=1
}

for check in "$@"; do
        kind=${check%%:*}
        rest=${check#*:}
        path=${rest%%:*}
        arg=${rest#"$path"}
        arg=${arg#:}
        f=$destdir$path
        case $kind in
        exe)
                [ -f "$f" ] && [ -x "$f" ] || fail "$path: not an installed executable"
                ;;
        file)
                [ -f "$f" ] || fail "$path: not installed"
                ;;
        same)
                if [ ! -f "$f" ]; then
                        fail "$path: not installed"
                elif ! cmp -s "$f" "$arg"; then
                        fail "$path: differs from $arg"
                fi
                ;;
        unit)
                if [ ! -f "$f" ]; then
                        fail "$path: not installed"
                elif ! grep -q "^ExecStart=$arg\( \|$\)" "$f"; then
                        fail "$path: ExecStart does not run $arg: $(grep '^ExecStart=' "$f")"
                elif grep -q '@[a-z]*@' "$f"; then
                        fail "$path: unsubstituted placeholders: $(grep -o '@[a-z]*@' "$f" | sort -u | tr '\n' ' ')"
                fi
                # What Documentation= points to in the installed tree must be there.
                for doc in $(sed -n 's|^Documentation=||p' "$f" 2>/dev/null); do
                        case $doc in
                        file://*) [ -f "$destdir${doc#file://}" ] ||
                                fail "$path: Documentation=$doc is not installed" ;;
                        esac
                done
                ;;
        lib)
                soname=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
                if [ ! -f "$f" ]; then
                        fail "$path: not installed"
                elif [ "$soname" != "$arg" ]; then
                        fail "$path: SONAME is '$soname', expected '$arg'"
                elif [ ! -e "$(dirname "$f")/$arg" ]; then
                        fail "$path: no $arg beside it for the dynamic loader"
                fi
                ;;
        link)
                pcdir=$path
                name=$arg
                libdir=$(PKG_CONFIG_LIBDIR="$destdir$pcdir" \
                        pkg-config --variable=libdir "$name" 2>/dev/null || true)
                cat >"$destdir/use-$name.c" <<'PROGRAM'
#include <aqua/aqua.h>
#include <stdio.h>

int main(void)
{
        printf("%s\n", aqua_version());
        return 0;
}
PROGRAM
                # The program is built as a user of the installed package would build it.
                if ! flags=$(PKG_CONFIG_LIBDIR="$destdir$pcdir" PKG_CONFIG_SYSROOT_DIR="$destdir" \
                                pkg-config --cflags --libs "$name" 2>&1); then
                        fail "$pcdir/$name.pc: pkg-config: $flags"
                elif ! out=$(${CC:-cc} ${CFLAGS:-} -o "$destdir/use-$name" "$destdir/use-$name.c" \
                                $flags 2>&1); then
                        fail "$name.pc: a program using it does not build: $out"
                elif ! version=$(LD_LIBRARY_PATH="$destdir$libdir" "$destdir/use-$name" 2>&1); then
                        fail "$name.pc: the program built with it does not run: $version"
                else
                        echo "built and ran a program with $name.pc: aqua_version() = $version"
                fi
                rm -f "$destdir/use-$name" "$destdir/use-$name.c"
                ;;
        *)
                fail "unknown check '$check'"
                ;;
        esac
done

# Test programs and internal static libraries are build products, never installed.
stray=$(cd "$destdir" && find . \( -name 'test-*' -o -name '*.a' \) | sed 's|^\.||')
[ -z "$stray" ] || fail "installed but internal: $stray"

echo "installed tree:"
(cd "$destdir" && find . -type f -o -type l | sed 's|^\.|  |' | sort)
[ "$failed" -eq 0 ] && echo "ok: $# checks" || exit 1
