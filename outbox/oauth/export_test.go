package oauth

// Names the external tests read.
var (
	MaxTokenBytes = maxTokenBytes
)
