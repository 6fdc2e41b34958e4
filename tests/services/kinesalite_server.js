// Start kinesalite (in-memory Kinesis) on 127.0.0.1:PORT with no artificial delays.
// Usage: node kinesalite_server.js PORT /path/to/node_modules/kinesalite
'use strict'
const port = parseInt(process.argv[2], 10)
const modulePath = process.argv[3] || 'kinesalite'
const kinesalite = require(modulePath)
const server = kinesalite({createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000})
server.listen(port, '127.0.0.1', function (err) {
  if (err) throw err
  console.log('kinesalite listening on 127.0.0.1:' + port)
})
// kinesalite rethrows a request's stream error (its index.js: req.on('error', err => { throw err })),
// so a client killed mid-request (the SIGKILL tests) took the whole server down. Such a request
// is gone with its client; the server goes on, as Kinesis does. Any other error still ends it.
process.on('uncaughtException', function (err) {
  if (err && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) {
    console.error('kinesalite: a client went away mid-request (' + err.code + ')')
    return
  }
  console.error((err && err.stack) || err)
  process.exit(1)
})
function stop () { server.close(function () { process.exit(0) }); setTimeout(function () { process.exit(0) }, 2000).unref() }
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
