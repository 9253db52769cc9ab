// Preloaded into the tests' Azurite (node --require, local/azurite.py `checkpoints=True`):
// save and restore the tables under one name prefix exactly as stored, ETags and timestamps
// included, in one request each. The crash explorer (tests/crash/checkpoint.py) saves a
// scenario's tables before the step a crash point is in, lets a forked copy of the run go
// on from there with its fault, and puts the tables back for the next one: the copy's host
// holds ETags it read before the fork, so a restore through the Table API (new ETags)
// would not do. Never loaded by the demo or the bench's own Azurite.
//
//   POST /__checkpoint/save?prefix=x0123456789     -> 204 (one saved copy per prefix)
//   POST /__checkpoint/restore?prefix=x0123456789  -> 204; 409 when nothing was saved
//   POST /__checkpoint/drop?prefix=x0123456789     -> 204 (the saved copy forgotten)
"use strict";
const http = require("http");
const path = require("path");

const STORE = require.resolve(
  "azurite/dist/src/table/persistence/LokiTableMetadataStore.js",
  { paths: [path.join(__dirname, "..")] },
);
const Store = require(STORE).default;
const TABLES = "$TABLES_COLLECTION$";
const stores = [];
const saved = new Map();

const init = Store.prototype.init;
Store.prototype.init = function (...args) {
  stores.push(this);
  return init.apply(this, args);
};

// A Loki document without Loki's own bookkeeping, deep-copied: later updates of the live
// document (Azurite changes some in place) must not reach the saved copy.
function copy(doc) {
  const { $loki, meta, ...rest } = doc; // eslint-disable-line no-unused-vars
  return structuredClone(rest);
}

function ownTables(db, prefix) {
  return db.getCollection(TABLES).find().filter((t) => t.table.startsWith(prefix));
}

function save(store, prefix) {
  const db = store.db;
  const tables = ownTables(db, prefix).map((t) => {
    const rows = db.getCollection(store.getTableCollectionName(t.account, t.table));
    return { table: copy(t), rows: rows ? rows.find().map(copy) : [] };
  });
  saved.set(prefix, tables);
}

function restore(store, prefix) {
  const db = store.db;
  const tables = saved.get(prefix);
  if (tables === undefined) return false;
  const registry = db.getCollection(TABLES);
  for (const t of ownTables(db, prefix)) {
    registry.remove(t);
    db.removeCollection(store.getTableCollectionName(t.account, t.table));
  }
  for (const { table, rows } of tables) {
    const model = copy(table);
    registry.insert(model);
    store.createCollectionForTable(model);
    const collection = db.getCollection(store.getTableCollectionName(model.account, model.table));
    if (rows.length) collection.insert(rows.map(copy));
  }
  return true;
}

function answer(request, response) {
  const url = new URL(request.url, "http://azurite");
  const prefix = url.searchParams.get("prefix") || "";
  const store = stores[0];
  let status = 204;
  let text = "";
  if (!/^[a-z][a-z0-9]{5,30}$/.test(prefix) || store === undefined) {
    [status, text] = [400, "a prefix of 6 to 31 lowercase letters and digits, after start"];
  } else if (url.pathname === "/__checkpoint/save") {
    save(store, prefix);
  } else if (url.pathname === "/__checkpoint/restore") {
    if (!restore(store, prefix)) [status, text] = [409, `nothing saved for ${prefix}`];
  } else if (url.pathname === "/__checkpoint/drop") {
    saved.delete(prefix);
  } else {
    [status, text] = [404, "save, restore or drop"];
  }
  request.resume();
  response.writeHead(status, { "Content-Type": "text/plain" });
  response.end(text);
}

const createServer = http.createServer;
http.createServer = function (...args) {
  const server = createServer.apply(this, args);
  const emit = server.emit;
  server.emit = function (event, request, response) {
    if (event === "request" && request.method === "POST" && request.url.startsWith("/__checkpoint/")) {
      answer(request, response);
      return true;
    }
    return emit.apply(this, arguments);
  };
  return server;
};
