#!/usr/bin/env bash
# Check the book's internal links: every relative link in docs/src/**/*.md
# must point at an existing file, and every `#anchor` at a heading of the
# page it names (mdBook's ids: lowercase, whitespace to `-`, everything but
# letters, digits, `_` and `-` dropped; a repeated heading gets `-1`, `-2`).
# Links to other sites (scheme:), mail and absolute paths are not checked.
#
#   docs/check-links.sh            # from anywhere; exit status 1 on a broken link
#
# Needs only python3.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/src"
exec python3 - "$src" <<'PY'
import os, re, sys

src = sys.argv[1]
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); target up to whitespace or ')'.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:[ \t]+.*)?$", re.M)
HTML = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")


def prose(path):
    """The page with fenced code blocks and inline code blanked out (newlines
    kept, so offsets still give line numbers)."""
    out, inside = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                inside = not inside
                out.append("\n")
            else:
                out.append("\n" if inside else line)
    text = "".join(out)
    return re.sub(r"(`+)(?:(?!\1).)+?\1",
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def slug(text):
    text = re.sub(r"<[^>]+>", "", text)                      # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)   # links: their text
    text = text.replace("`", "")
    out = []
    for c in text.strip().lower():
        if c.isalnum() or c in "_-":
            out.append(c)
        elif c.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    if path not in cache:
        seen, ids = {}, set()
        inside = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    inside = not inside
                    continue
                m = None if inside else HEADING.match(line)
                if m:
                    base = slug(m.group(2))
                    k = seen.get(base, 0)
                    ids.add(base if k == 0 else f"{base}-{k}")
                    seen[base] = k + 1
                for a in re.findall(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']""", line):
                    ids.add(a)
        cache[path] = ids
    return cache[path]


errors = []
pages = []
for root, dirs, files in os.walk(src):
    dirs.sort()
    for name in sorted(files):
        if name.endswith(".md"):
            pages.append(os.path.join(root, name))

for page in pages:
    rel = os.path.relpath(page, src)
    text = prose(page)
    found = [(m.start(), m.group(1)) for m in INLINE.finditer(text)]
    found += [(m.start(), m.group(1)) for m in HTML.finditer(text)]
    found += [(m.start(), m.group(1)) for m in REFDEF.finditer(text)]
    for pos, t in sorted(found):
        n = text.count("\n", 0, pos) + 1
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) or t.startswith("/"):
            continue
        file_part, _, anchor = t.partition("#")
        target = page if file_part == "" else os.path.normpath(
            os.path.join(os.path.dirname(page), file_part))
        where = f"{rel}:{n}"
        if not os.path.exists(target):
            errors.append(f"{where}: {t}: no file {os.path.relpath(target, src)}")
            continue
        if anchor:
            if not target.endswith(".md"):
                errors.append(f"{where}: {t}: an anchor into a file that is not a page")
            elif anchor not in anchors(target):
                errors.append(
                    f"{where}: {t}: no heading with id #{anchor} in "
                    f"{os.path.relpath(target, src)}")

for e in errors:
    print(e, file=sys.stderr)
if errors:
    print(f"{len(errors)} broken link(s) in {src}", file=sys.stderr)
    sys.exit(1)
print(f"{len(pages)} pages, every internal link resolves")
PY
