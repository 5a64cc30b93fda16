package destconfig_test

import (
	"fmt"
	"log"

	"github.com/mcp-outbox/mcp-outbox/outbox/destconfig"
)

// Destinations from the environment and --dest flags, for
// dispatch.Options.Destinations. The credential comes from the
// environment only.
func ExampleParse() {
	environ := []string{ // as os.Environ returns it
		"HOME=/home/app", // not a destination: ignored
		"MCP_OUTBOX_DEST_PAYMENTS=https://payments.example.test/v1",
		"MCP_OUTBOX_DEST_PAYMENTS_AUTH=Bearer sk_test",
	}
	flags := []string{ // the values of repeated --dest flags
		"payments=https://payments.example.test/v1;timeout=3s;max_attempts=5",
		"mailer=http://127.0.0.1:8025;at_most_once;probe=GET /sent/{key}",
	}
	dests, err := destconfig.Parse(environ, flags)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dests {
		fmt.Printf("%s %s timeout=%v max_attempts=%d at_most_once=%v auth=%q\n",
			d.Name, d.URL, d.Timeout, d.MaxAttempts, d.AtMostOnce, d.AuthHeader)
	}
	_, err = destconfig.Parse(nil, []string{"payments=https://payments.example.test;auth=sk_test"})
	fmt.Println(err)
	// Output:
	// mailer http://127.0.0.1:8025 timeout=0s max_attempts=0 at_most_once=true auth=""
	// payments https://payments.example.test/v1 timeout=3s max_attempts=5 at_most_once=false auth="Authorization"
	// --dest payments: give the credential in MCP_OUTBOX_DEST_PAYMENTS_AUTH, not on the command line
}
