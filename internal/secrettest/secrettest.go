// Package secrettest holds the hostile secrets the parsers' tests put in
// URLs unencoded (passwords and tokens holding the characters that end or
// split a URL's parts), and the check that a text shows none of them.
package secrettest

import (
	"net/url"
	"strings"
)

// Hostile are passwords or tokens a user may paste into a URL as they are,
// each holding what a URL parser reads as a delimiter (? / # @ & = % : ,)
// or cannot take unencoded (unicode), with a head of digits where a parser
// would read it as a port. Each is distinctive: no 4-byte run of it is
// found in an error message of its own accord.
var Hostile = []string{
	"Qz?S3cr3tTail",
	"Qz/S3cr3tTail",
	"Qz#S3cr3tTail",
	"Qz@S3cr3tTail",
	"Qz&k=S3cr3tTail",
	"Qz=Vq&S3cr3tTail",
	"Qz%zzS3cr3tTail",
	"Qz%41S3cr3tTail",
	"Qz:S3cr3t:Tail",
	"Qzü€S3cr3tTail",
	"Qz,S3cr3tTail",
	"20247/S3cr3tTail",
	"99998?S3cr3t&Tail=1",
	"8765#S3cr3tTail",
	"Qz?a=1&S3cr3t/T#l@x",
}

// Leak returns the first run of 4 bytes of secret that text holds, or ""
// when it holds none: of secret as written, percent-decoded (as a parser
// reads it) or percent-encoded (as a URL shows it).
func Leak(text, secret string) string {
	forms := []string{secret, url.PathEscape(secret), url.QueryEscape(secret)}
	if dec, err := url.PathUnescape(secret); err == nil {
		forms = append(forms, dec)
	}
	for _, form := range forms {
		for i := 0; i+4 <= len(form); i++ {
			if run := form[i : i+4]; strings.Contains(text, run) {
				return run
			}
		}
	}
	return ""
}
