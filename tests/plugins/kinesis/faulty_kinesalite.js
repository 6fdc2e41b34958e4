// kinesalite with fault injection, for headrace-kinesis tests.
// Usage: node faulty_kinesalite.js PORT /path/to/node_modules/kinesalite CONTROL_JSON
// CONTROL_JSON is re-read every 20 ms; fields (all optional):
//   clockOffsetMs  added to the server clock (iterator expiry after 300 s, retention trimming)
//   gen            a counter: when it changes, the fault counters below are (re)armed
//   throttleGetRecords  the next N GetRecords fail with ProvisionedThroughputExceededException
//   limitListShards     the next N ListShards fail with LimitExceededException
//   partialPutRecords   the next N PutRecords fail every 2nd record (partial failure)
'use strict'
const fs = require('fs')
const port = parseInt(process.argv[2], 10)
const modulePath = process.argv[3]
const control = process.argv[4]
let offset = 0, gen = null
const left = {throttleGetRecords: 0, limitListShards: 0, partialPutRecords: 0}
const realNow = Date.now
Date.now = function () { return realNow() + offset }
function reload () {
  let c
  try { c = JSON.parse(fs.readFileSync(control, 'utf8')) } catch (e) { return }
  offset = c.clockOffsetMs || 0
  if (c.gen !== gen) {
    gen = c.gen
    for (const k of Object.keys(left)) left[k] = c[k] || 0
  }
}
reload()
setInterval(reload, 20).unref()
const db = require(modulePath + '/db')
function wrap (name, fn) {
  const p = require.resolve(modulePath + '/actions/' + name)
  const orig = require(p)
  require.cache[p].exports = fn(orig)
}
wrap('getRecords', orig => function (store, data, cb) {
  if (left.throttleGetRecords > 0) {
    left.throttleGetRecords--
    return cb(db.clientError('ProvisionedThroughputExceededException', 'Rate exceeded for shard (injected by the test)'))
  }
  return orig(store, data, cb)
})
wrap('listShards', orig => function (store, data, cb) {
  if (left.limitListShards > 0) {
    left.limitListShards--
    return cb(db.clientError('LimitExceededException', 'Rate exceeded for stream (injected by the test)'))
  }
  return orig(store, data, cb)
})
wrap('putRecords', orig => function (store, data, cb) {
  if (left.partialPutRecords <= 0 || data.Records.length < 2) return orig(store, data, cb)
  left.partialPutRecords--
  const keep = data.Records.filter((r, i) => i % 2 === 0)
  orig(store, Object.assign({}, data, {Records: keep}), function (err, res) {
    if (err) return cb(err)
    const out = []
    let k = 0
    for (let i = 0; i < data.Records.length; i++) {
      if (i % 2 === 0) out.push(res.Records[k++])
      else out.push({ErrorCode: 'ProvisionedThroughputExceededException', ErrorMessage: 'Rate exceeded (injected by the test)'})
    }
    cb(null, {FailedRecordCount: (res.FailedRecordCount || 0) + Math.floor(data.Records.length / 2), Records: out})
  })
})
const kinesalite = require(modulePath)
const server = kinesalite({createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000})
server.listen(port, '127.0.0.1', function (err) {
  if (err) throw err
  console.log('faulty kinesalite listening on 127.0.0.1:' + port)
})
function stop () { server.close(function () { process.exit(0) }); setTimeout(function () { process.exit(0) }, 2000).unref() }
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
