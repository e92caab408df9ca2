package sqlschema

// DistributeSQL exposes distributeSQL to the external tests.
var DistributeSQL = distributeSQL
