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
    r.internalRedirect("@" + target + (r.headersIn[SESSION_HEADER] ? "_s" : "_l"));
}

export default {route, client_rec};
