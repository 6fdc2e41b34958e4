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
function stop () { server.close(function () { process.exit(0) }); setTimeout(function () { process.exit(0) }, 2000).unref() }
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
