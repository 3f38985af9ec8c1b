package cache

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// BenchmarkUpstreamFormat weighs protobuf against JSON as the upstream
// encoding of built-in objects, per object: what the API server pays to
// encode it, and what the daemon pays to read it (metadata, managedFields
// cut). "protobuf-then-json" is what converting a protobuf object for a
// JSON client would cost: the reason the daemon never converts.
func BenchmarkUpstreamFormat(b *testing.B) {
	jsonS, protoS := serializer(b, runtime.ContentTypeJSON), protoSerializer(b)
	for _, obj := range []runtime.Object{formatConfigMap(), formatPod()} {
		kind := fmt.Sprintf("%T", obj)[len("*v1."):]
		jsonBytes, protoBytes := encode(b, jsonS, obj), encode(b, protoS, obj)
		for _, f := range []struct {
			name string
			s    runtime.Serializer
			data []byte
		}{{"json", jsonS, jsonBytes}, {"protobuf", protoS, protoBytes}} {
			b.Run(kind+"/apiserver-encode/"+f.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					encode(b, f.s, obj)
				}
			})
			b.Run(kind+"/daemon-read/"+f.name, func(b *testing.B) {
				b.SetBytes(int64(len(f.data)))
				b.ReportAllocs()
				for b.Loop() {
					if _, _, err := decodeAnyObject(f.data, true); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(kind+"/daemon-read/protobuf-then-json", func(b *testing.B) {
			b.SetBytes(int64(len(protoBytes)))
			b.ReportAllocs()
			for b.Loop() {
				o, _, err := protoS.Decode(protoBytes, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				o.(metav1.Object).SetManagedFields(nil)
				encode(b, jsonS, o)
			}
		})
		b.Logf("%s: %d bytes as JSON, %d as protobuf", kind, len(jsonBytes), len(protoBytes))
	}
}

func formatConfigMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "cm-00042", Namespace: "bench", UID: "6f1c0d2e-3b4a-4c5d-8e9f-0a1b2c3d4e5f", ResourceVersion: "123456",
			Labels: map[string]string{"app": "bench", "shard": "3"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "bench", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:data":{".":{},"f:payload":{}}}`)}}},
		Data: map[string]string{"payload": strings.Repeat("abcdefghijklmnopqrstuvwxyz", 40)},
	}
}

func formatPod() *corev1.Pod {
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	env := []corev1.EnvVar{}
	for _, k := range []string{"LOG_LEVEL", "REGION", "FEATURE_FLAGS", "UPSTREAM_URL", "CACHE_SIZE"} {
		env = append(env, corev1.EnvVar{Name: k, Value: strings.ToLower(k) + "-value"})
	}
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "web-00042", Namespace: "bench", UID: "6f1c0d2e-3b4a-4c5d-8e9f-0a1b2c3d4e5f", ResourceVersion: "123456",
			Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5"}},
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Containers: []corev1.Container{
				{Name: "app", Image: "registry.example.com/team/web:v1.42.0", Env: env, Resources: res,
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}},
				{Name: "proxy", Image: "registry.example.com/mesh/proxy:v2.7.1", Resources: res},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.42", HostIP: "192.168.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}
