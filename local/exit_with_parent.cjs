// Preloaded into Azurite (node --require): exit when standard input closes. Its write end is
// held by the Python process that started Azurite (local/azurite.py), so when that process
// dies in any way, a SIGKILLed pytest worker or demo included, the kernel closes the pipe
// and Azurite goes with it instead of being left running.
"use strict";
const leave = () => process.exit(0);
process.stdin.on("end", leave);
process.stdin.on("close", leave);
process.stdin.on("error", leave);
process.stdin.resume();
