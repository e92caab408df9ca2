package stmt

// ScanRow is scanPrefix, for the external tests.
var ScanRow = scanPrefix
