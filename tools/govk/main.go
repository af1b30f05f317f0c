// Command govk runs one virtual node with the upstream Go virtual-kubelet library (node/nodeutil)
// and a trivial in-memory provider: the yardstick that bench/burst.py compares vkprovider with.
//
// CreatePod marks the pod Running at once (Ready condition, one running container status) and
// tells the pod controller through NotifyPods; DeletePod reports the pod terminated and forgets
// it. Nothing else happens: no HTTP listener (no TLS config is given, so nodeutil starts none),
// and no cloud unless --cloud-url names one.
//
// --cloud-url puts vkprovider's mock cloud behind the provider (cloud.go): an instance is
// rented before a pod is reported Running and deleted with it.
//
// --lift-limits replaces the rate limiters of the pod controller's three work queues with ones
// that never delay a first attempt (retries still back off per item) and raises the client's
// QPS and burst; without it the library's defaults stand (client-go QPS 5 / burst 10, queues
// limited to 10 items/s with a burst of 100).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vklogrus "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

type options struct {
	kubeconfig string
	nodeName   string
	taint      string
	liftLimits bool
	workers    int
	logLevel   string
	cloudURL   string
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig path")
	flag.StringVar(&o.nodeName, "node-name", "govk", "name of the virtual node")
	flag.StringVar(&o.taint, "taint", "virtual-kubelet.io/provider=vkprovider:NoSchedule",
		"taint of the node as key=value:effect (empty: none)")
	flag.BoolVar(&o.liftLimits, "lift-limits", false,
		"unlimited work-queue rate limiters and a very high client QPS/burst")
	flag.IntVar(&o.workers, "workers", 0, "pod sync workers (0: the library default, NumCPU)")
	flag.StringVar(&o.logLevel, "log-level", "info", "logrus level")
	flag.StringVar(&o.cloudURL, "cloud-url", "",
		"base URL of a vkprovider mock cloud to rent an instance from per pod (empty: none)")
	flag.Parse()
	return o
}

func main() {
	o := parseFlags()
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "govk: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	level, err := logrus.ParseLevel(o.logLevel)
	if err != nil {
		return err
	}
	logger := logrus.New()
	logger.SetLevel(level)
	vklog.L = vklogrus.FromLogrus(logrus.NewEntry(logger))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	client, err := newClient(o)
	if err != nil {
		return err
	}
	taints, err := parseTaint(o.taint)
	if err != nil {
		return err
	}
	nodeOpts := []nodeutil.NodeOpt{nodeutil.WithClient(client), withNodeSetup(o.workers, taints)}
	if o.liftLimits {
		nodeOpts = append(nodeOpts, nodeutil.WithPodControllerConfigOverrides(liftQueueLimits))
	}
	var cloud *cloudClient
	if o.cloudURL != "" {
		cloud = newCloudClient(o.cloudURL, o.nodeName, o.workers)
	}
	newProvider := func(nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		return &unsupported{memoryProvider: newMemoryProvider(cloud)}, nil, nil
	}
	vk, err := nodeutil.NewNode(o.nodeName, newProvider, nodeOpts...)
	if err != nil {
		return err
	}
	go func() {
		if err := vk.WaitReady(ctx, time.Minute); err == nil {
			logger.WithField("node", o.nodeName).WithField("liftLimits", o.liftLimits).
				WithField("cloud", o.cloudURL).Info("node ready")
		}
	}()
	if err := vk.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// newClient builds the clientset; with lift-limits its QPS and burst are raised far past need.
func newClient(o options) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "govk/" + o.nodeName
	if o.liftLimits {
		cfg.QPS = 1e6
		cfg.Burst = 1e6
	}
	return kubernetes.NewForConfig(cfg)
}

func parseTaint(spec string) ([]corev1.Taint, error) {
	if spec == "" {
		return nil, nil
	}
	keyValue, effect, ok := strings.Cut(spec, ":")
	if !ok {
		return nil, fmt.Errorf("taint %q: want key=value:effect", spec)
	}
	key, value, _ := strings.Cut(keyValue, "=")
	return []corev1.Taint{{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}}, nil
}

// withNodeSetup sets the worker count and the node's taints and never-limiting capacity.
func withNodeSetup(workers int, taints []corev1.Taint) nodeutil.NodeOpt {
	return func(cfg *nodeutil.NodeConfig) error {
		if workers > 0 {
			cfg.NumWorkers = workers
		}
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("100000"),
			corev1.ResourceMemory: resource.MustParse("100Ti"),
			corev1.ResourcePods:   resource.MustParse("10000"),
			"nvidia.com/gpu":      resource.MustParse("100000"),
		}
		cfg.NodeSpec.Spec.Taints = taints
		cfg.NodeSpec.Status.Capacity = capacity
		cfg.NodeSpec.Status.Allocatable = capacity.DeepCopy()
		cfg.NodeSpec.Labels["kubernetes.io/os"] = "linux"
		cfg.NodeSpec.Status.NodeInfo.OperatingSystem = "linux"
		cfg.NodeSpec.Status.NodeInfo.Architecture = "amd64"
		cfg.NodeSpec.Status.NodeInfo.KubeletVersion = "govk"
		return nil
	}
}

// liftQueueLimits replaces the three queues' default limiters (per-item exponential backoff
// combined with a 10 items/s, burst 100 token bucket) with one that has no overall limit.
func liftQueueLimits(cfg *node.PodControllerConfig) error {
	cfg.SyncPodsFromKubernetesRateLimiter = newRetryOnlyLimiter()
	cfg.DeletePodsFromKubernetesRateLimiter = newRetryOnlyLimiter()
	cfg.SyncPodStatusFromProviderRateLimiter = newRetryOnlyLimiter()
	return nil
}

// retryOnlyLimiter lets a key's first attempt through at once and backs off its retries
// exponentially (5 ms doubling, at most 10 s) until the key is forgotten; no shared budget.
type retryOnlyLimiter struct {
	mu       sync.Mutex
	failures map[any]int
}

var _ workqueue.TypedRateLimiter[any] = (*retryOnlyLimiter)(nil)

func newRetryOnlyLimiter() *retryOnlyLimiter {
	return &retryOnlyLimiter{failures: map[any]int{}}
}

func (r *retryOnlyLimiter) When(item any) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.failures[item]
	r.failures[item] = n + 1
	if n == 0 {
		return 0
	}
	backoff := 5 * time.Millisecond * time.Duration(math.Pow(2, float64(min(n-1, 20))))
	return min(backoff, 10*time.Second)
}

func (r *retryOnlyLimiter) Forget(item any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.failures, item)
}

func (r *retryOnlyLimiter) NumRequeues(item any) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures[item]
}

// memoryProvider keeps pods in a map; every pod it is given runs at once (once its instance is
// rented, when there is a cloud).
type memoryProvider struct {
	mu        sync.Mutex
	pods      map[string]*corev1.Pod
	instances map[string]string // pod key -> instance id, with a cloud
	cloud     *cloudClient      // nil: no cloud
	notify    func(*corev1.Pod)
}

func newMemoryProvider(cloud *cloudClient) *memoryProvider {
	return &memoryProvider{pods: map[string]*corev1.Pod{}, instances: map[string]string{}, cloud: cloud}
}

func podKey(namespace, name string) string { return namespace + "/" + name }

func (p *memoryProvider) NotifyPods(_ context.Context, f func(*corev1.Pod)) { p.notify = f }

func (p *memoryProvider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	if p.cloud != nil {
		id, err := p.cloud.create(ctx, pod)
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.instances[key] = id
		p.mu.Unlock()
	}
	running := pod.DeepCopy()
	markRunning(running, metav1.Now())
	p.mu.Lock()
	p.pods[key] = running
	p.mu.Unlock()
	p.notify(running.DeepCopy())
	return nil
}

func (p *memoryProvider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	defer p.mu.Unlock()
	old, ok := p.pods[key]
	if !ok {
		return errdefs.NotFoundf("pod %s not found", key)
	}
	updated := pod.DeepCopy()
	updated.Status = *old.Status.DeepCopy()
	p.pods[key] = updated
	return nil
}

func (p *memoryProvider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	if p.cloud != nil {
		p.mu.Lock()
		id, ok := p.instances[key]
		p.mu.Unlock()
		if ok {
			if err := p.cloud.remove(ctx, id); err != nil {
				return err
			}
			p.mu.Lock()
			delete(p.instances, key)
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	old, ok := p.pods[key]
	delete(p.pods, key)
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s not found", key)
	}
	markTerminated(old, metav1.Now())
	p.notify(old)
	return nil
}

func (p *memoryProvider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[podKey(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, name)
	}
	return pod.DeepCopy(), nil
}

func (p *memoryProvider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *memoryProvider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.DeepCopy())
	}
	return out, nil
}

func markRunning(pod *corev1.Pod, now metav1.Time) {
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.HostIP = "127.0.0.1"
	pod.Status.PodIP = "127.0.0.1"
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

func markTerminated(pod *corev1.Pod, now metav1.Time) {
	pod.Status.Phase = corev1.PodSucceeded
	pod.Status.Reason = "ProviderDeleted"
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady || pod.Status.Conditions[i].Type == corev1.ContainersReady {
			pod.Status.Conditions[i].Status = corev1.ConditionFalse
			pod.Status.Conditions[i].LastTransitionTime = now
		}
	}
	for i := range pod.Status.ContainerStatuses {
		cs := &pod.Status.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready = false
		cs.Started = ptr(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: now,
		}}
	}
}

func ptr[T any](v T) *T { return &v }

// unsupported answers the kubelet-API calls (logs, exec, stats, ...) that the bench never makes.
type unsupported struct {
	*memoryProvider
}

var errUnsupported = errors.New("not supported by the in-memory provider")

func (unsupported) GetContainerLogs(context.Context, string, string, string, api.ContainerLogOpts) (io.ReadCloser, error) {
	return nil, errUnsupported
}

func (unsupported) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errUnsupported
}

func (unsupported) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errUnsupported
}

func (unsupported) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errUnsupported
}

func (unsupported) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errUnsupported
}

func (unsupported) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errUnsupported
}
