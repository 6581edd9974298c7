// Command importimage writes the image of an OCI archive into a CRI-O's
// storage (containers/storage at its root and runroot, the vfs driver) under
// a name: how the CRI lab gives its private CRI-O the pause image, with no
// registry to pull from. It is CRI-O's test/copyimg less what reaches outside
// the storage: containers/image keeps its blob info cache in
// /var/lib/containers/cache and unpacks archives in /var/tmp unless told
// otherwise, and copyimg reads /etc/containers/storage.conf.
//
//	importimage --root ROOT --runroot RUNROOT --name localhost/hoptrace-pause:lab --archive image.tar
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containers/image/v5/copy"
	"github.com/containers/image/v5/oci/archive"
	"github.com/containers/image/v5/signature"
	istorage "github.com/containers/image/v5/storage"
	"github.com/containers/image/v5/types"
	"github.com/containers/storage"
	"github.com/containers/storage/pkg/reexec"
)

func main() {
	// containers/storage applies layers in a re-executed child (chrootarchive).
	if reexec.Init() {
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "importimage:", err)
		os.Exit(1)
	}
}

func run() (err error) {
	root := flag.String("root", "", "the storage's root (CRI-O's root)")
	runroot := flag.String("runroot", "", "the storage's run root (CRI-O's runroot)")
	name := flag.String("name", "", "the image's name in the storage")
	file := flag.String("archive", "", "an OCI archive (a tar of an OCI image layout) holding one image")
	flag.Parse()
	if *root == "" || *runroot == "" || *name == "" || *file == "" {
		return errors.New("need --root, --runroot, --name and --archive")
	}
	store, err := storage.GetStore(storage.StoreOptions{GraphRoot: *root, RunRoot: *runroot, GraphDriverName: "vfs"})
	if err != nil {
		return fmt.Errorf("open the storage at %s: %w", *root, err)
	}
	defer func() {
		if _, shutErr := store.Shutdown(false); shutErr != nil {
			err = errors.Join(err, shutErr)
		}
	}()
	dest, err := istorage.Transport.ParseStoreReference(store, *name)
	if err != nil {
		return fmt.Errorf("image name %s: %w", *name, err)
	}
	src, err := archive.NewReference(*file, "")
	if err != nil {
		return fmt.Errorf("archive %s: %w", *file, err)
	}
	// The lab's own image: nothing to verify.
	policy, err := signature.NewPolicyContext(&signature.Policy{
		Default: signature.PolicyRequirements{signature.NewPRInsecureAcceptAnything()},
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, policy.Destroy()) }()
	tmp := filepath.Join(*runroot, "importimage")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sys := &types.SystemContext{BlobInfoCacheDir: filepath.Join(*root, "blob-info-cache"), BigFilesTemporaryDir: tmp}
	if _, err := copy.Image(context.Background(), policy, dest, src, &copy.Options{SourceCtx: sys, DestinationCtx: sys}); err != nil {
		return fmt.Errorf("copy %s into the storage as %s: %w", *file, *name, err)
	}
	return nil
}
