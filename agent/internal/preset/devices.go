package preset

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"

	"github.com/hoptrace/hoptrace/agent/internal/netns"
)

// Device is a resolved network device: its namespace and index there.
type Device struct {
	Name      string `json:"name"`
	Ifindex   uint32 `json:"ifindex"`
	Netns     string `json:"netns"`
	NetnsIno  uint64 `json:"netns_ino"`
	Resolved  string `json:"resolved"` // how it was found, e.g. "default route"
	nsPathArg string
}

// ipJSON runs `ip -j ARGS` inside the namespace at nsPath. The child is
// forked from the thread netns.Do moved, so it starts in that namespace.
func ipJSON(nsPath string, out any, args ...string) error {
	var raw []byte
	err := netns.Do(nsPath, func() error {
		b, err := exec.Command("ip", append([]string{"-j"}, args...)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return fmt.Errorf("ip %v: %s", args, ee.Stderr)
			}
			return fmt.Errorf("ip %v: %w", args, err)
		}
		raw = b
		return nil
	})
	if err != nil {
		return err
	}
	if len(raw) == 0 {
		raw = []byte("[]")
	}
	return json.Unmarshal(raw, out)
}

type ipRoute struct {
	Dst string `json:"dst"`
	Dev string `json:"dev"`
}

type ipLink struct {
	Ifname   string `json:"ifname"`
	Link     string `json:"link"`
	LinkInfo struct {
		InfoKind string `json:"info_kind"`
		InfoData struct {
			Link string `json:"link"`
		} `json:"info_data"`
	} `json:"linkinfo"`
}

// defaultRouteDev is the device of the namespace's default route (IPv4, then IPv6).
func defaultRouteDev(nsPath string) (string, error) {
	for _, fam := range []string{"-4", "-6"} {
		var routes []ipRoute
		if err := ipJSON(nsPath, &routes, fam, "route", "show", "default"); err != nil {
			return "", err
		}
		for _, r := range routes {
			if r.Dev != "" {
				return r.Dev, nil
			}
		}
	}
	return "", fmt.Errorf("no default route in netns %s", nsPath)
}

// routeDev is the device the namespace routes addr through.
func routeDev(nsPath, addr string) (string, error) {
	var routes []ipRoute
	if err := ipJSON(nsPath, &routes, "route", "get", addr); err != nil {
		return "", err
	}
	if len(routes) == 0 || routes[0].Dev == "" {
		return "", fmt.Errorf("no route to %s in netns %s", addr, nsPath)
	}
	return routes[0].Dev, nil
}

// underlay follows a tunnel device (VXLAN, Geneve) to the device its
// encapsulated packets leave by: the one MACE calls "physical".
func underlay(nsPath, dev string) (string, error) {
	var links []ipLink
	if err := ipJSON(nsPath, &links, "-d", "link", "show", "dev", dev); err != nil {
		return "", err
	}
	if len(links) == 0 {
		return "", fmt.Errorf("device %s not found", dev)
	}
	l := links[0]
	switch l.LinkInfo.InfoKind {
	case "vxlan", "geneve":
		if l.LinkInfo.InfoData.Link != "" {
			return l.LinkInfo.InfoData.Link, nil
		}
		return "", fmt.Errorf("tunnel %s has no underlying device (created without dev): pass --outer", dev)
	}
	return dev, nil
}

func resolveDevice(nsPath, name, how string) (Device, error) {
	idx, err := netns.Ifindex(nsPath, name)
	if err != nil {
		return Device{}, fmt.Errorf("device %s in netns %s: %w", name, nsPath, err)
	}
	ino, err := netns.Inode(nsPath)
	if err != nil {
		return Device{}, err
	}
	return Device{Name: name, Ifindex: uint32(idx), Netns: nsPath, NetnsIno: ino, Resolved: how, nsPathArg: nsPath}, nil
}

// ResolveDevices finds MACE's inner device (the container's default route
// device, or inner) and outer device (outer; else the host's route to peer;
// else the host's default route; a tunnel is followed to its underlay).
func ResolveDevices(containerNs, hostNs, inner, outer, peer string) (Device, Device, error) {
	how := "--inner"
	if inner == "" {
		d, err := defaultRouteDev(containerNs)
		if err != nil {
			return Device{}, Device{}, fmt.Errorf("inner device: %w (pass --inner)", err)
		}
		inner, how = d, "container default route"
	}
	in, err := resolveDevice(containerNs, inner, how)
	if err != nil {
		return Device{}, Device{}, err
	}
	how = "--outer"
	if outer == "" {
		var d string
		if peer != "" {
			d, err = routeDev(hostNs, peer)
			how = "host route to " + peer
		} else {
			d, err = defaultRouteDev(hostNs)
			how = "host default route"
		}
		if err != nil {
			return Device{}, Device{}, fmt.Errorf("outer device: %w (pass --peer ADDR or --outer DEV)", err)
		}
		u, err := underlay(hostNs, d)
		if err != nil {
			return Device{}, Device{}, fmt.Errorf("outer device: %w", err)
		}
		if u != d {
			how += " via " + d
		}
		outer = u
	}
	out, err := resolveDevice(hostNs, outer, how)
	if err != nil {
		return Device{}, Device{}, err
	}
	if in.NetnsIno == out.NetnsIno && in.Ifindex == out.Ifindex {
		return Device{}, Device{}, fmt.Errorf("inner and outer device are the same (%s): is --host-netns the container's?", in.Name)
	}
	return in, out, nil
}
