// The optional cloud behind the in-memory provider: with --cloud-url, CreatePod rents an instance
// from vkprovider's mock cloud (POST /instances) before it reports the pod Running, and DeletePod
// deletes it (DELETE /instances/{id}). The mock boots instances at once in the bench, so the pod
// is Running when the create call returns, as it is for vkprovider against the same mock.
//
// Why it exists: the in-memory provider makes no call per pod, vkprovider makes two (a create
// and a delete) to a cloud that shares the bench's two cores. With a cloud, both nodes do the
// same work per pod, so their pod engines are compared like for like. The client is plain
// net/http with keep-alive connections, one per worker at most, and the same tags vkprovider
// puts on an instance (its node and its pod's uid), so the mock's ledger times both alike.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const (
	tagNode = "vkprovider.io/node"
	tagUID  = "vkprovider.io/uid"
)

type cloudClient struct {
	base string
	node string
	http *http.Client
}

func newCloudClient(base, node string, workers int) *cloudClient {
	conns := max(workers, 16)
	transport := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
	}
	return &cloudClient{
		base: strings.TrimRight(base, "/"),
		node: node,
		http: &http.Client{Transport: transport, Timeout: 30 * time.Second},
	}
}

type createBody struct {
	Name     string            `json:"name"`
	Image    string            `json:"image"`
	GPUCount int64             `json:"gpu_count"`
	Tags     map[string]string `json:"tags"`
}

type instance struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// create rents one instance for the pod and returns its id.
func (c *cloudClient) create(ctx context.Context, pod *corev1.Pod) (string, error) {
	gpus := int64(1)
	if len(pod.Spec.Containers) > 0 {
		if q, ok := pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; ok && q.Value() > 0 {
			gpus = q.Value()
		}
	}
	image := ""
	if len(pod.Spec.Containers) > 0 {
		image = pod.Spec.Containers[0].Image
	}
	payload, err := json.Marshal(createBody{
		Name:     pod.Namespace + "-" + pod.Name,
		Image:    image,
		GPUCount: gpus,
		Tags:     map[string]string{tagNode: c.node, tagUID: string(pod.UID)},
	})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/instances", bytes.NewReader(payload))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("create instance for %s/%s: HTTP %d: %.200s", pod.Namespace, pod.Name,
			resp.StatusCode, body)
	}
	var got instance
	if err := json.Unmarshal(body, &got); err != nil {
		return "", fmt.Errorf("create instance for %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if got.ID == "" {
		return "", fmt.Errorf("create instance for %s/%s: answer has no id", pod.Namespace, pod.Name)
	}
	return got.ID, nil
}

// remove deletes the instance; one that is already gone is not an error.
func (c *cloudClient) remove(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.base+"/instances/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusAccepted, http.StatusNoContent, http.StatusNotFound:
		return nil
	}
	return fmt.Errorf("delete instance %s: HTTP %d: %.200s", id, resp.StatusCode, body)
}
