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
var DISPATCH = "least_conn";
// Model upstream -> its instances and their named locations (least_score).
var MEMBERS = {
    "m_llama": [
        {
            "down": false,
            "loc": "m_llama_i0",
            "name": "l1"
        }
    ],
    "m_qwen": [
        {
            "down": false,
            "loc": "m_qwen_i0",
            "name": "q1"
        },
        {
            "down": true,
            "loc": "m_qwen_i1",
            "name": "q2"
        }
    ],
    "m_qwen_v2": [
        {
            "down": false,
            "loc": "m_qwen_v2_i0",
            "name": "q3"
        }
    ]
};
var SCORES_FILE = "/var/lib/clusterctl-gateway/scores.json";
var PICKS_DIR = "/var/lib/clusterctl-gateway/picks";
var ADMIN_TOKEN_FILE = "/etc/nginx/clusterctl/admin.token";
// Scores older than this are not trusted for load (down marks still are).
var STALE_S = 30;
// A score of 1: every seat of the instance busy (a session may leave it, below).
var OVERLOAD = 1.0;

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
        return fs.readFileSync(path).length;
    } catch (e) {
        return 0;
    }
}

// Requests this gateway host sent to an instance and that have not ended, counted in two
// files per instance of fixed-width records (the send time in ms, base 36), appended with
// O_APPEND (atomic across workers): picks/NAME when a request is sent, picks/NAME.done when
// it ends.  In flight = records in the first minus the second.  The admin endpoint, when
// scores arrive, drops the pairs that ended (and records older than MAX_AGE_MS).
var REC = 10;
var MAX_AGE_MS = 3600000;

function stamp(ms) {
    return ("000000000" + ms.toString(36)).slice(-(REC - 1)) + "\n";
}

function in_flight(name) {
    return Math.max(0, (size(PICKS_DIR + "/" + name) - size(PICKS_DIR + "/" + name + ".done")) / REC);
}

function fnv(text) {
    var h = 0x811c9dc5;
    for (var i = 0; i < text.length; i++) {
        h ^= text.charCodeAt(i);
        h = Math.imul(h, 0x01000193) >>> 0;
    }
    return h;
}

// The instance for one request: among the model's instances not marked down, the lowest
// score = max(requests in flight x step (1 / seats), the engine's KV cache use as last
// measured) + half a step x (1 - capacity): a free seat first, the faster GPU at a tie.  A session keeps its instance (highest rendezvous hash over the candidates:
// when one goes, only its own sessions move) unless that one is full (score >= 1: every
// seat busy) and another is at least half a batch freer.
function pick(r, upstream) {
    var members = MEMBERS[upstream] || [];
    var scores = read_json(SCORES_FILE) || {};
    var known = scores.instances || {};
    var fresh = typeof scores.at === "number" && Date.now() / 1000 - scores.at < STALE_S;
    var cands = [];
    for (var i = 0; i < members.length; i++) {
        var m = members[i];
        var s = known[m.name] || {};
        if (m.down || s.down) {
            continue;
        }
        var load = fresh && typeof s.load === "number" ? s.load : 0;
        var step = typeof s.step === "number" ? s.step : 0.01;
        var cap = fresh && typeof s.cap === "number" ? s.cap : 1;
        cands.push({m: m, score: Math.max(load, in_flight(m.name) * step) + (1 - cap) * step / 2});
    }
    if (cands.length === 0) {
        return null;
    }
    var low = null;
    var ties = 0;
    for (var k = 0; k < cands.length; k++) {
        var c = cands[k];
        if (low === null || c.score < low.score) {
            low = c;
            ties = 1;
        } else if (c.score === low.score && Math.random() * ++ties < 1) {
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
        if (home.score < OVERLOAD || home.score - low.score < OVERLOAD / 2) {
            return home.m;
        }
    }
    return low.m;
}

function send(r, upstream) {
    if (DISPATCH !== "least_score") {
        r.internalRedirect("@" + upstream + (r.headersIn[SESSION_HEADER] ? "_s" : "_l"));
        return;
    }
    var m = pick(r, upstream);
    if (m === null) {
        error(r, 503, "OverloadedError", "no instance can take the request now (all marked down)");
        return;
    }
    try {
        var rec = stamp(Date.now());
        fs.appendFileSync(PICKS_DIR + "/" + m.name, rec);
        r.variables.gw_pick = m.name + " " + rec.trim();
    } catch (e) {
        // no counter (directory missing): the pick still stands
    }
    r.internalRedirect("@" + m.loc);
}

// js_set $gw_done, evaluated by the access log when the request ends (streams too, and
// cut ones): the end of a request sent by least_score is recorded.
function done(r) {
    var p = r.variables.gw_pick;
    if (!p) {
        return "";
    }
    var f = p.split(" ");
    if (f.length === 2 && /^[A-Za-z0-9_.-]+$/.test(f[0])) {
        try {
            fs.appendFileSync(PICKS_DIR + "/" + f[0] + ".done", f[1] + "\n");
        } catch (e) {
            return "";
        }
    }
    return "";
}

function records(path) {
    var text = "";
    try {
        text = fs.readFileSync(path).toString();
    } catch (e) {
        return [];
    }
    var out = [];
    for (var i = 0; i + REC <= text.length; i += REC) {
        out.push(text.substring(i, i + REC));
    }
    return out;
}

// Drop the requests that ended (a send record and its end record) and records older than
// MAX_AGE_MS, so the files stay small; temp + rename (an end appended in between is lost:
// its request then counts until MAX_AGE_MS).
function compact(name, now_ms) {
    var base = PICKS_DIR + "/" + name;
    var ended = {};
    var ends = records(base + ".done");
    for (var i = 0; i < ends.length; i++) {
        ended[ends[i]] = (ended[ends[i]] || 0) + 1;
    }
    var keep = "";
    var sent = records(base);
    for (var j = 0; j < sent.length; j++) {
        var rec = sent[j];
        if (ended[rec]) {
            ended[rec] -= 1;
        } else if (now_ms - parseInt(rec, 36) < MAX_AGE_MS) {
            keep += rec;
        }
    }
    var tmp = base + ".tmp." + process.pid;
    fs.writeFileSync(tmp, keep);
    fs.renameSync(tmp, base);
    fs.writeFileSync(tmp, "");
    fs.renameSync(tmp, base + ".done");
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
    var tmp = SCORES_FILE + ".tmp." + process.pid;
    fs.writeFileSync(tmp, JSON.stringify(body));
    fs.renameSync(tmp, SCORES_FILE);
    var names = Object.keys(body.instances);
    for (var i = 0; i < names.length; i++) {
        if (/^[A-Za-z0-9_.-]+$/.test(names[i])) {
            compact(names[i], Date.now());
        }
    }
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
    var model;
    try {
        model = JSON.parse(body).model;
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
    send(r, target);
}

export default {route, client_rec, set_scores, done};
