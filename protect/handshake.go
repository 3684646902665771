package protect

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
)

// The contact's keys (docs/wire.md §12.2). The opener draws an ephemeral
// X25519 key for each Hello; the answering side derives its own from a
// secret and the Hello (its source, both QPs, its token), so that it
// keeps nothing until the opener's first sealed frame, which carries
// the initial block, lets it derive the same key again. Both then run
//
//	prk    = HKDF-Extract(salt = "udiwarp contact v1" || psk, X25519 secret)
//	okm    = HKDF-Expand(prk, transcript, 72)
//	secret opener→answerer = okm[0:32], answerer→opener = okm[32:64]
//	key ID at the answerer = okm[64:68], at the opener = okm[68:72]
//
// where the transcript is "udiwarp contact" || mode || opener QP ||
// answering QP || opener epoch || Hello token || keyed token || opener
// share || answering share, and psk is the pair's pre-shared key, if any.

// transcript is what a contact's keys bind.
type transcript struct {
	mode                  Mode
	openerQP, answerQP    uint32
	openerEpoch           uint32
	helloToken, keyedTok  uint64
	openerShare, ansShare []byte
}

// sessionKeys are a contact's two directions and the key IDs each side
// receives by.
type sessionKeys struct {
	o2r, r2o         []byte
	idAnswer, idOpen uint32
}

func (t *transcript) derive(dh, psk []byte) sessionKeys {
	salt := append([]byte("udiwarp contact v1"), psk...)
	prk, err := hkdf.Extract(sha256.New, dh, salt)
	if err != nil {
		panic(err)
	}
	info := make([]byte, 0, 128)
	info = append(info, "udiwarp contact"...)
	info = append(info, byte(t.mode))
	info = binary.BigEndian.AppendUint32(info, t.openerQP)
	info = binary.BigEndian.AppendUint32(info, t.answerQP)
	info = binary.BigEndian.AppendUint32(info, t.openerEpoch)
	info = binary.BigEndian.AppendUint64(info, t.helloToken)
	info = binary.BigEndian.AppendUint64(info, t.keyedTok)
	info = append(info, t.openerShare...)
	info = append(info, t.ansShare...)
	okm := expand(prk, string(info), 72)
	k := sessionKeys{o2r: okm[0:32], r2o: okm[32:64],
		idAnswer: binary.BigEndian.Uint32(okm[64:]), idOpen: binary.BigEndian.Uint32(okm[68:])}
	k.idAnswer, k.idOpen = max(k.idAnswer, 1), max(k.idOpen, 1) // 0 names no key
	return k
}

// initialBlock is the Sealed envelope's initial block.
func (t *transcript) initialBlock() []byte {
	b := make([]byte, 0, InitialSize)
	b = append(b, t.openerShare...)
	b = binary.BigEndian.AppendUint64(b, t.helloToken)
	b = binary.BigEndian.AppendUint64(b, t.keyedTok)
	b = binary.BigEndian.AppendUint32(b, t.openerQP)
	b = binary.BigEndian.AppendUint32(b, t.answerQP)
	return binary.BigEndian.AppendUint32(b, t.openerEpoch)
}

// parseInitial reads an initial block (InitialSize bytes).
func parseInitial(b []byte, m Mode) *transcript {
	return &transcript{mode: m, openerShare: b[:32], helloToken: binary.BigEndian.Uint64(b[32:]),
		keyedTok: binary.BigEndian.Uint64(b[40:]), openerQP: binary.BigEndian.Uint32(b[48:]),
		answerQP: binary.BigEndian.Uint32(b[52:]), openerEpoch: binary.BigEndian.Uint32(b[56:])}
}

// answerKey is the answering side's X25519 key for a Hello from src:
// a keyed hash of the Hello under secret, so that it is the same when the
// opener's first sealed frame comes back and nothing is kept meanwhile.
func answerKey(secret []byte, src netip.AddrPort, openerQP, answerQP uint32, helloToken uint64) *ecdh.PrivateKey {
	m := hmac.New(sha256.New, secret)
	a := src.Addr().As16()
	var b [16 + 2 + 4 + 4 + 8]byte
	copy(b[:], a[:])
	binary.BigEndian.PutUint16(b[16:], src.Port())
	binary.BigEndian.PutUint32(b[18:], openerQP)
	binary.BigEndian.PutUint32(b[22:], answerQP)
	binary.BigEndian.PutUint64(b[26:], helloToken)
	m.Write([]byte("udiwarp answer key"))
	m.Write(b[:])
	k, err := ecdh.X25519().NewPrivateKey(m.Sum(nil))
	if err != nil {
		panic(err) // any 32 bytes are an X25519 private key
	}
	return k
}

// pskSecret is the traffic secret of a pre-shared key's direction
// under keyID (the sender draws keyID at random when it starts, so a
// restarted sender never reuses a nonce under the same key).
func pskSecret(psk []byte, m Mode, keyID uint32) []byte {
	prk, err := hkdf.Extract(sha256.New, psk, []byte("udiwarp psk v1"))
	if err != nil {
		panic(err)
	}
	var info [len("udiwarp psk") + 5]byte
	n := copy(info[:], "udiwarp psk")
	info[n] = byte(m)
	binary.BigEndian.PutUint32(info[n+1:], keyID)
	return expand(prk, string(info[:]), secretSize)
}
