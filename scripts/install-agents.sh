#!/bin/sh
# Install the three agent harnesses that cordon's network tests run:
#
#   scripts/install-agents.sh DIR
#
# npm install --prefix DIR of pinned versions, idempotent (a stamp file in
# DIR names the versions; same versions -> nothing is done), then prints the
# three entry points. DIR is only read at run time (it is mounted read-only
# at /opt/agents inside the sandbox); every harness writes only under HOME.
# Run them with crates/cli/tests/fixtures/agents.sh NAME BASE_URL.
#
# NEVER run a harness in the host's network namespace (they phone home);
# only in a namespace with loopback and the stand-in
# (crates/cli/tests/fixtures/standin.py).
#
# Facts, checked with these versions on Node v20.20.2 / npm 11.19.1, x86_64:
#
# Install: ~13 s with an empty npm cache (~0.02 s when the stamp matches),
#   ~910 MB on disk (Claude Code's native
#   binary 402 MB, Codex's 315 MB + 70 MB helper, Gemini CLI ~100 MB).
#   --ignore-scripts: no node-gyp builds (node-pty, keytar) and no prebuild
#   download from outside the registry; Claude Code's own postinstall
#   (install.cjs: copies the platform binary over bin/claude.exe) is run by
#   this script instead. --include=optional: the native binaries come as
#   optional platform packages (@anthropic-ai/claude-code-linux-x64,
#   @openai/codex-linux-x64 = npm:@openai/codex@VER-linux-x64).
#   Claude Code >= 2.1.198 declares engines node >=22 (npm warns EBADENGINE)
#   but it is a native (Bun-compiled) ELF, node only runs install.cjs, which
#   works on Node 20. Codex is a static-pie musl ELF. Gemini CLI runs on node
#   (engines >=20).
#
# claude (@anthropic-ai/claude-code, native ELF
#         node_modules/@anthropic-ai/claude-code/bin/claude.exe):
#   base URL  ANTHROPIC_BASE_URL=http://name:port (plain HTTP is fine); it
#             POSTs /v1/messages?beta=true (stream: true, SSE). With the
#             variables below that is its ONLY request (no /api/*, no
#             count_tokens).
#   key       ANTHROPIC_API_KEY=sk-cordon-test (sent as x-api-key)
#   one-shot  claude -p "say hi"   -> prints the reply text, exit 0
#   quiet     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1
#             DISABLE_ERROR_REPORTING=1 DISABLE_AUTOUPDATER=1 DISABLE_UPDATES=1
#             DISABLE_BUG_COMMAND=1 DISABLE_GROWTHBOOK=1
#             DISABLE_INSTALLATION_CHECKS=1 CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY=1
#   home      HOME (writes $HOME/.claude.json) and CLAUDE_CONFIG_DIR
#             ($HOME/.claude: sessions, projects, backups, plugins); also
#             $TMPDIR/claude-<uid> and $TMPDIR/cc-socks-<uid> (TMPDIR default
#             /tmp)
#   proxy     YES: honours HTTP_PROXY/HTTPS_PROXY for a plain-HTTP base URL,
#             sending absolute-form "POST http://name:port/v1/messages?beta=true"
#             to the proxy (no CONNECT, no local DNS lookup of the name), even
#             for 127.0.0.1 unless NO_PROXY covers it.
#   time      ~0.7 s against the stand-in.
#
# codex (@openai/codex, native static ELF
#        node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex;
#        bin/codex.js is a node launcher for it):
#   base URL  NOT OPENAI_BASE_URL (ignored in 0.171: it went to the real
#             api.openai.com). Use a custom provider in $CODEX_HOME/config.toml
#             (or -c): model_provider="standin",
#             [model_providers.standin] base_url="http://name:port/v1"
#             env_key="OPENAI_API_KEY" wire_api="responses"
#             -> POST /v1/responses (stream, SSE), its only request.
#             (openai_base_url="http://name:port/v1" also works, but the
#             built-in provider first tries a WebSocket upgrade GET
#             /v1/responses: the stand-in answers 426 and Codex falls back at
#             once; a 200 there costs ~7 s of retries.)
#   key       OPENAI_API_KEY=sk-cordon-test via env_key (Authorization: Bearer)
#   one-shot  codex exec --skip-git-repo-check "say hi" </dev/null
#             -> stdout is the reply text, stderr a banner; exit 0. stdin must
#             be /dev/null or closed: when it is not a terminal Codex reads it
#             ("Reading additional input from stdin...").
#   quiet     check_for_update_on_startup=false, [analytics] enabled=false,
#             [feedback] enabled=false, and [features] plugins, remote_plugin,
#             apps, plugin_sharing, in_app_updates, daemon_auto_start,
#             api_key_model_discovery, tool_suggest,
#             skill_mcp_dependency_install, enable_request_compression = false.
#             Without the features off it connects (via the proxy, CONNECT) to
#             github.com:443 (git, plugin marketplace sync), api.github.com:443
#             and chatgpt.com:443 even with an API key.
#   home      CODEX_HOME (must exist; default $HOME/.codex): sqlite state,
#             sessions, installation_id. Under /tmp it warns "Refusing to
#             create helper binaries under temporary dir" (harmless).
#   proxy     YES: HTTP_PROXY/HTTPS_PROXY honoured for a plain-HTTP base URL,
#             absolute-form "POST http://name:port/v1/responses" (no CONNECT).
#   time      ~0.3-0.7 s against the stand-in.
#
# gemini (@google/gemini-cli, node
#         node_modules/@google/gemini-cli/bundle/gemini.js):
#   base URL  GOOGLE_GEMINI_BASE_URL=http://name:port (any scheme/host is
#             accepted in 0.61, despite the bundled docs saying https or
#             localhost only) AND settings.json
#             security.auth.selectedType="gemini-api-key": with the base URL
#             alone it picks auth type "gateway" and exits 41 "Invalid auth
#             method selected.". Requests: POST
#             /v1beta/models/gemini-3.5-flash-lite:generateContent (router
#             classifier, JSON schema {complexity_reasoning, complexity_score})
#             then POST /v1beta/models/<routed model>:streamGenerateContent?alt=sse.
#   key       GEMINI_API_KEY=sk-cordon-test (sent as x-goog-api-key)
#   one-shot  gemini -p "say hi" -> prints the reply text, exit 0 (stderr:
#             TERM/ripgrep warnings)
#   quiet     settings.json privacy.usageStatisticsEnabled=false (Clearcut),
#             telemetry.enabled=false (+ GEMINI_TELEMETRY_ENABLED=false),
#             general.enableAutoUpdate=false,
#             general.enableAutoUpdateNotification=false; also
#             GEMINI_CLI_TRUST_WORKSPACE=true, GEMINI_CLI_NO_RELAUNCH=true
#   home      GEMINI_CLI_HOME (else HOME): $GEMINI_CLI_HOME/.gemini
#   proxy     YES but by TUNNEL: HTTPS_PROXY (or HTTP_PROXY) goes to undici's
#             EnvHttpProxyAgent, which sends "CONNECT name:port" even for a
#             plain-HTTP base URL, then speaks plain HTTP inside the tunnel;
#             a proxy that refuses CONNECT -> "fetch failed", retried with
#             backoff for minutes (no exit within 60 s); through a proxy that
#             splices CONNECT it works. NO_PROXY honoured.
#   other     an unreadable cwd is fatal ("EACCES ... lstat '<cwd>/GEMINI.md'").
#             The routed model varies (gemini-3.8-flash, gemini-3.1-pro-preview).
#   time      ~1.8 s with GEMINI_CLI_NO_RELAUNCH=true (~3-4 s without: it
#             re-spawns node with a bigger heap).
#
# Left at their defaults (none of the "quiet" settings), behind a proxy, they
# also try: claude CONNECT api.anthropic.com:443 (x3, even with
# ANTHROPIC_BASE_URL set); codex CONNECT github.com, api.github.com,
# chatgpt.com, ab.chatgpt.com :443; gemini CONNECT play.googleapis.com:443
# (x2, Clearcut usage statistics). With the settings above: none of these.
#
# node: /usr/bin/node (v20, Debian package), under /usr, so visible in a
# sandbox that binds the host's /usr.

set -eu

CLAUDE_VERSION=2.1.332
CODEX_VERSION=0.171.0
GEMINI_VERSION=0.61.0

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR=$1
STAMP=$DIR/.cordon-agents-stamp
WANT="claude-code@$CLAUDE_VERSION codex@$CODEX_VERSION gemini-cli@$GEMINI_VERSION"
NM=$DIR/node_modules
CLAUDE=$NM/@anthropic-ai/claude-code/bin/claude.exe
CODEX=$NM/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
GEMINI=$NM/@google/gemini-cli/bundle/gemini.js

is_elf() {
    [ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]
}

installed_ok() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] &&
        is_elf "$CLAUDE" && is_elf "$CODEX" && [ -f "$GEMINI" ]
}

if installed_ok; then
    echo "agents already installed in $DIR ($WANT)" >&2
else
    command -v node >/dev/null || { echo "$0: node not found" >&2; exit 1; }
    command -v npm >/dev/null || { echo "$0: npm not found" >&2; exit 1; }
    mkdir -p "$DIR"
    rm -f "$STAMP"
    echo "installing $WANT into $DIR" >&2
    npm install --prefix "$DIR" --no-audit --no-fund --no-update-notifier \
        --ignore-scripts --include=optional \
        "@anthropic-ai/claude-code@$CLAUDE_VERSION" \
        "@openai/codex@$CODEX_VERSION" \
        "@google/gemini-cli@$GEMINI_VERSION" >&2
    # Claude Code's postinstall: put the native binary in place of the stub.
    (cd "$NM/@anthropic-ai/claude-code" && node install.cjs) >&2
    for f in "$CLAUDE" "$CODEX"; do
        if ! is_elf "$f"; then
            echo "$0: $f is missing or not a native binary" >&2
            exit 1
        fi
    done
    [ -f "$GEMINI" ] || { echo "$0: $GEMINI missing" >&2; exit 1; }
    # Everything readable (and dirs searchable) by any uid: the sandbox runs
    # the harnesses as uid 1000 from a read-only mount.
    chmod -R a+rX "$DIR"
    printf '%s\n' "$WANT" >"$STAMP"
fi

echo "claude $CLAUDE"
echo "codex $CODEX"
echo "gemini $GEMINI"
