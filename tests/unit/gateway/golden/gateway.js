// Written by `clusterctl gateway deploy`; do not edit.
// Routes an OpenAI-style request by the "model" in its JSON body to the
// named location of that model's instances: *_s (sticky, hashed on the
// session header) when the request has one, *_l (least connections) if not.
var ROUTES = {
    "Qwen/Qwen3-8B": {
        "canary": "m_qwen_v2",
        "gray": "gw_gray_0",
        "upstream": "m_qwen"
    },
    "llama": {
        "upstream": "m_llama"
    }
};
var SESSION_HEADER = "X-Session-ID";
// least_score: njs picks the instance (below); least_conn: nginx's upstreams do.
var DISPATCH = "least_score";
// Model upstream -> its instances, their named locations and 1 / seats (least_score).
var MEMBERS = {
    "m_llama": [
        {
            "down": false,
            "loc": "m_llama_i0",
            "name": "l1",
            "step": 0.003906
        }
    ],
    "m_qwen": [
        {
            "down": false,
            "loc": "m_qwen_i0",
            "name": "q1",
            "step": 0.003906
        },
        {
            "down": true,
            "loc": "m_qwen_i1",
            "name": "q2",
            "step": 0.003906
        }
    ],
    "m_qwen_v2": [
        {
            "down": false,
            "loc": "m_qwen_v2_i0",
            "name": "q3",
            "step": 0.003906
        }
    ]
};
var SCORES_FILE = "/var/lib/clusterctl-gateway/scores.json";
var PICKS_DIR = "/var/lib/clusterctl-gateway/picks";
var ADMIN_TOKEN_FILE = "/etc/nginx/clusterctl/admin.token";
// Scores older than this are not trusted for load (down marks still are).
var STALE_S = 30;
// KV cache use (as last measured) from which an instance has no free seat: admitting more
// would wait for blocks or preempt (doctor's kv_cache_usage_warn default).
var KV_FULL = 0.9;
// gateway.max_conns (0: none): an instance with this many requests in flight from this gateway
// host takes no more; none left is a 503 at once.  nginx's own max_conns counts per upstream
// zone, and each instance's upstream lists the others as backups, so it cannot be the guard.
var MAX_CONNS = 4;

var crypto = require("crypto");
var fs = require("fs");
var CLIENTS_FILE = "/etc/nginx/clusterctl/clients.json";

// js_set $gw_client_rec: "NAME|RATE|STREAMS" for a known Bearer key, else "".
// Only the key's SHA-256 is looked up, in a file read per request (a revoked
// key fails at once, no reload); the key itself is never stored or logged.
function client_rec(r) {
    var h = r.headersIn.Authorization;
    var m = h ? /^Bearer +([A-Za-z0-9._~+\/=-]+) *$/i.exec(h) : null;
    if (!m) {
        return "";
    }
    var clients;
    try {
        clients = JSON.parse(fs.readFileSync(CLIENTS_FILE));
    } catch (e) {
        r.error("gateway: cannot read " + CLIENTS_FILE + ": " + e);
        return "";
    }
    var c = clients[crypto.createHash("sha256").update(m[1]).digest("hex")];
    return c ? c.name + "|" + c.rate + "|" + c.streams : "";
}

function error(r, status, type, message) {
    r.headersOut["Content-Type"] = "application/json";
    r.return(status, JSON.stringify({error: {message: message, type: type, code: status}}) + "\n");
}

function models(r) {
    var data = Object.keys(ROUTES).sort().map(function (id) {
        return {id: id, object: "model", owned_by: "clusterctl-gateway"};
    });
    r.headersOut["Content-Type"] = "application/json";
    r.return(200, JSON.stringify({object: "list", data: data}) + "\n");
}

function read_json(path) {
    try {
        return JSON.parse(fs.readFileSync(path));
    } catch (e) {
        return null;
    }
}

function size(path) {
    try {
        return fs.statSync(path).size;
    } catch (e) {
        return 0;
    }
}

// What this gateway host sent to an instance and has not seen end, kept in files (njs 0.7.9
// has no shared memory; Debian 12's njs): per generation directory PICKS_DIR/<gen>/, per
// instance NAME.n (one byte per request sent), NAME.w (its work: one byte per WORK_UNIT
// tokens), and NAME.n.d / NAME.w.d, the same bytes appended when the request ends (O_APPEND:
// atomic across workers).  In flight = size of the first minus size of the second, summed over
// the live generations: only stat() per request, nothing read.  The scores post (admin
// endpoint) starts a new generation when the current one is balanced (everything in it ended)
// or older than GEN_MS, and deletes balanced ones and ones older than MAX_AGE_MS; a request
// ends in the generation it started in, so nothing is lost by the switch.
var MAX_AGE_MS = 3600000;
var GEN_MS = 60000;
// Work of a request in tokens: what it asks to generate (each output token is an engine step
// holding a seat) plus its prompt at PREFILL_TOKENS prompt tokens per step's worth; the prompt
// is estimated at 4 bytes a token (no tokenizer in the gateway).
var WORK_UNIT = 16;
var PREFILL_TOKENS = 64;
var DEFAULT_MAX_TOKENS = 256;

function work_units(req) {
    var out = req && (typeof req.max_tokens === "number" ? req.max_tokens
        : typeof req.max_completion_tokens === "number" ? req.max_completion_tokens : DEFAULT_MAX_TOKENS);
    var text = !req ? "" : typeof req.prompt === "string" ? req.prompt
        : req.messages || req.prompt ? JSON.stringify(req.messages || req.prompt) : "";
    var tokens = Math.max(1, out) + text.length / 4 / PREFILL_TOKENS;
    return Math.max(1, Math.min(4096, Math.ceil(tokens / WORK_UNIT)));
}

// The live generations; before the first scores post, generation 0 (made on first use).
function live_gens(scores) {
    var live = [];
    var gens = scores.gens || [{id: 0}];
    for (var i = 0; i < gens.length; i++) {
        if (/^[0-9]+$/.test(String(gens[i].id))) {
            live.push(String(gens[i].id));
        }
    }
    return live;
}

// [requests, work units] this host has in flight on NAME.
function in_flight(name, gens) {
    var n = 0;
    var w = 0;
    for (var i = 0; i < gens.length; i++) {
        var base = PICKS_DIR + "/" + gens[i] + "/" + name;
        n += size(base + ".n") - size(base + ".n.d");
        w += size(base + ".w") - size(base + ".w.d");
    }
    return [Math.max(0, n), Math.max(0, w)];
}

function fnv(text) {
    var h = 0x811c9dc5;
    for (var i = 0; i < text.length; i++) {
        h ^= text.charCodeAt(i);
        h = Math.imul(h, 0x01000193) >>> 0;
    }
    return h;
}

// The instance for one request, among the model's instances not marked down:
// 1. one with a free seat first: fewer requests in flight than seats (1 / step, from
//    --max-num-seqs) and its KV cache, as last measured, under KV_FULL: the request starts
//    at once;
// 2. among those (or among all when none has a free seat), the least outstanding work per
//    seat, weighed by capacity (measured throughput over the model's best on mixed GPUs):
//    the queue that empties first.  Ties: an even random choice.
// A session keeps its instance (highest rendezvous hash over the candidates: when one goes,
// only its own sessions move) unless that one has no free seat and another has.
// Instances at MAX_CONNS are no candidates; "full" when that leaves none (null: all down).
function pick(r, upstream, units, scores) {
    var members = MEMBERS[upstream] || [];
    var full = 0;
    var known = scores.instances || {};
    var fresh = typeof scores.at === "number" && Date.now() / 1000 - scores.at < STALE_S;
    var gens = live_gens(scores);
    var cands = [];
    for (var i = 0; i < members.length; i++) {
        var m = members[i];
        var s = known[m.name] || {};
        if (m.down || s.down) {
            continue;
        }
        var load = fresh && typeof s.load === "number" ? s.load : 0;
        // seats: as sync last posted them, else as rendered (--max-num-seqs of the inventory)
        var step = typeof s.step === "number" && s.step > 0 ? s.step : m.step > 0 ? m.step : 0.01;
        var cap = fresh && typeof s.cap === "number" && s.cap > 0 ? s.cap : 1;
        var f = in_flight(m.name, gens);
        if (MAX_CONNS > 0 && f[0] >= MAX_CONNS) {
            full++;
            continue;
        }
        var free = f[0] + 1 <= Math.round(1 / step) && load < KV_FULL;
        cands.push({m: m, free: free, key: (free ? 0 : 1) * 1e9 + (f[1] + units) * step / cap});
    }
    if (cands.length === 0) {
        return full > 0 ? "full" : null;
    }
    var low = null;
    var ties = 0;
    for (var k = 0; k < cands.length; k++) {
        var c = cands[k];
        if (low === null || c.key < low.key) {
            low = c;
            ties = 1;
        } else if (c.key === low.key && Math.random() * ++ties < 1) {
            low = c;  // an even choice among equal scores
        }
    }
    var session = r.headersIn[SESSION_HEADER];
    if (session) {
        var home = null;
        var top = -1;
        for (var j = 0; j < cands.length; j++) {
            var w = fnv(session + "\u0000" + cands[j].m.name);
            if (w > top) {
                top = w;
                home = cands[j];
            }
        }
        if (home.free || !low.free) {
            return home.m;
        }
    }
    return low.m;
}

function append(path, text) {
    fs.appendFileSync(path, text);
}

function mkdir(path) {
    try {
        fs.mkdirSync(path);
    } catch (e) {
        if (e.code !== "EEXIST") {
            throw e;
        }
    }
}

function send(r, upstream, req) {
    if (DISPATCH !== "least_score") {
        r.internalRedirect("@" + upstream + (r.headersIn[SESSION_HEADER] ? "_s" : "_l"));
        return;
    }
    var units = work_units(req);
    var scores = read_json(SCORES_FILE) || {};
    var m = pick(r, upstream, units, scores);
    if (m === null || m === "full") {
        error(r, 503, "OverloadedError", m === null ? "no instance can take the request now (all marked down)"
            : "no instance can take the request now (all at their connection limit or down)");
        return;
    }
    var gen = typeof scores.gen === "number" ? String(scores.gen) : "0";
    try {
        if (gen === "0") {
            mkdir(PICKS_DIR + "/0");
        }
        var base = PICKS_DIR + "/" + gen + "/" + m.name;
        append(base + ".w", "w".repeat(units));
        append(base + ".n", "n");
        r.variables.gw_pick = gen + " " + m.name + " " + units;
    } catch (e) {
        // no counter (the generation just went): the pick still stands, uncounted
    }
    r.internalRedirect("@" + m.loc);
}

// js_set $gw_done, evaluated by the access log when the request ends (streams too, and
// cut ones): the end of a request sent by least_score is recorded in its generation.
function done(r) {
    var p = r.variables.gw_pick;
    if (!p) {
        return "";
    }
    var f = p.split(" ");
    if (f.length === 3 && /^[0-9]+$/.test(f[0]) && /^[A-Za-z0-9_.-]+$/.test(f[1]) && /^[0-9]+$/.test(f[2])) {
        var base = PICKS_DIR + "/" + f[0] + "/" + f[1];
        try {
            append(base + ".n.d", "n");
            append(base + ".w.d", "w".repeat(Math.min(4096, parseInt(f[2], 10))));
        } catch (e) {
            return "";
        }
    }
    return "";
}

// True when everything sent in generation directory DIR has ended (each NAME.n matches NAME.n.d).
function balanced(dir) {
    var files = [];
    try {
        files = fs.readdirSync(dir);
    } catch (e) {
        return true;
    }
    for (var i = 0; i < files.length; i++) {
        var f = files[i];
        if (/\.[nw]$/.test(f) && size(dir + "/" + f) !== size(dir + "/" + f + ".d")) {
            return false;
        }
    }
    return true;
}

function remove_gen(dir) {
    try {
        var files = fs.readdirSync(dir);
        for (var i = 0; i < files.length; i++) {
            fs.unlinkSync(dir + "/" + files[i]);
        }
        fs.rmdirSync(dir);
    } catch (e) {
        // gone already
    }
}

// The generations after this scores post: balanced or too old ones deleted, a new current one
// when the current is balanced (or old): {gen, gens: [{id, at}]}.
function upkeep(prev, now_ms) {
    var gens = [];
    var old = prev.gens || [{id: 0, at: now_ms}];
    var cur = typeof prev.gen === "number" ? prev.gen : 0;
    var cur_at = now_ms;
    for (var i = 0; i < old.length; i++) {
        var g = old[i];
        if (typeof g.id !== "number" || typeof g.at !== "number") {
            continue;
        }
        var dir = PICKS_DIR + "/" + g.id;
        if (now_ms - g.at > MAX_AGE_MS || balanced(dir)) {
            remove_gen(dir);
            continue;
        }
        gens.push(g);
        if (g.id === cur) {
            cur_at = g.at;
        }
    }
    var alive = gens.some(function (g) { return g.id === cur; });
    if (!alive || now_ms - cur_at > GEN_MS) {
        cur = cur + 1;
        mkdir(PICKS_DIR + "/" + cur);
        gens.push({id: cur, at: now_ms});
    }
    return {gen: cur, gens: gens};
}

// POST /gateway/scores on the loopback admin server, from `gateway sync`:
// {"at": EPOCH_S, "instances": {NAME: {"load", "step", "down", "reason"}}}.
function set_scores(r) {
    var token = "";
    try {
        token = fs.readFileSync(ADMIN_TOKEN_FILE).toString().trim();
    } catch (e) {
        token = "";
    }
    if (r.method !== "POST" || token === "" || r.headersIn["X-Gateway-Admin"] !== token) {
        error(r, 403, "PermissionError", "scores need POST and the admin token");
        return;
    }
    var body;
    try {
        body = JSON.parse(r.requestText);
    } catch (e) {
        error(r, 400, "BadRequestError", "the scores are not JSON");
        return;
    }
    if (typeof body.at !== "number" || typeof body.instances !== "object" || body.instances === null) {
        error(r, 400, "BadRequestError", "expected {at, instances}");
        return;
    }
    var g = upkeep(read_json(SCORES_FILE) || {}, Date.now());
    body.gen = g.gen;
    body.gens = g.gens;
    var tmp = SCORES_FILE + ".tmp." + process.pid;
    fs.writeFileSync(tmp, JSON.stringify(body));
    fs.renameSync(tmp, SCORES_FILE);
    var names = Object.keys(body.instances);
    r.headersOut["Content-Type"] = "application/json";
    r.return(200, JSON.stringify({ok: true, instances: names.length}) + "\n");
}

function route(r) {
    if (r.method === "GET" && r.uri === "/v1/models") {
        models(r);
        return;
    }
    if (r.method !== "POST") {
        error(r, 405, "BadRequestError", "the gateway routes POST /v1/... requests by their model");
        return;
    }
    var body = r.requestText;
    if (body === undefined) {
        error(r, 413, "BadRequestError", "request body too large for the gateway");
        return;
    }
    var req;
    var model;
    try {
        req = JSON.parse(body);
        model = req.model;
    } catch (e) {
        error(r, 400, "BadRequestError", "the request body is not JSON");
        return;
    }
    var route = (typeof model === "string") ? ROUTES[model] : undefined;
    if (route === undefined) {
        error(r, 404, "NotFoundError", "The model `" + model + "` does not exist.");
        return;
    }
    var target = route.upstream;
    if (route.gray && route.canary !== null && r.variables[route.gray] === "canary") {
        target = route.canary;
    }
    if (target === null) {
        error(r, 503, "OverloadedError", "no instance serves the model `" + model + "`");
        return;
    }
    send(r, target, req);
}

export default {route, client_rec, set_scores, done};
