package controlplane

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// ServiceAccountToken creates ServiceAccount namespace/name if it does not
// exist and mints a real token for it through the TokenRequest API. With no
// audiences the token is for the API server itself (see TokenConfig); with
// audiences it is for those services (for example informerd's).
func ServiceAccountToken(ctx context.Context, admin kubernetes.Interface, namespace, name string, audiences ...string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ServiceAccount %s/%s: %w", namespace, name, err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}
	tr, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// Grant gives ServiceAccount saNamespace/saName the rules: in namespace
// through a Role and RoleBinding, or cluster-wide through a ClusterRole and
// ClusterRoleBinding when namespace is "". Objects are named after the
// ServiceAccount; an existing grant is replaced. It returns once the API
// server's authorizer allows every verb of every rule (RBAC bindings take
// effect through its informers), so that a check made next is not denied.
func Grant(ctx context.Context, admin kubernetes.Interface, saNamespace, saName, namespace string, rules ...rbacv1.PolicyRule) error {
	if err := grant(ctx, admin, saNamespace, saName, namespace, rules); err != nil {
		return err
	}
	return waitForAccess(ctx, admin, saNamespace, saName, namespace, rules)
}

// waitForAccess waits until SubjectAccessReviews allow the ServiceAccount
// every verb of every rule in namespace.
func waitForAccess(ctx context.Context, admin kubernetes.Interface, saNamespace, saName, namespace string, rules []rbacv1.PolicyRule) error {
	spec := authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + saNamespace + ":" + saName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
	}
	var checks []authorizationv1.SubjectAccessReviewSpec
	for _, r := range rules {
		for _, verb := range r.Verbs {
			for _, path := range r.NonResourceURLs {
				s := spec
				s.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: path, Verb: verb}
				checks = append(checks, s)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					s := spec
					s.ResourceAttributes = &authorizationv1.ResourceAttributes{Verb: verb, Group: g, Resource: res, Namespace: namespace}
					checks = append(checks, s)
				}
			}
		}
	}
	for _, s := range checks {
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, startTimeout, true, func(ctx context.Context) (bool, error) {
			r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: s}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("RBAC never allowed %s %+v %+v: %w", s.User, s.ResourceAttributes, s.NonResourceAttributes, err)
		}
	}
	return nil
}

func grant(ctx context.Context, admin kubernetes.Interface, saNamespace, saName, namespace string, rules []rbacv1.PolicyRule) error {
	name := grantName(saNamespace, saName)
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNamespace, Name: saName}}
	rbac := admin.RbacV1()
	if namespace == "" {
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
		if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating ClusterRole %s: %w", name, err)
		}
		_, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   subjects,
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating ClusterRoleBinding %s: %w", name, err)
		}
		return nil
	}
	_ = rbac.RoleBindings(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	_ = rbac.Roles(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if _, err := rbac.Roles(namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Role %s/%s: %w", namespace, name, err)
	}
	_, err := rbac.RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating RoleBinding %s/%s: %w", namespace, name, err)
	}
	return nil
}

func grantName(saNamespace, saName string) string {
	return "informerd-test-" + saNamespace + "-" + saName
}

// WaitForDefaultServiceAccount waits until kube-controller-manager has
// created the "default" ServiceAccount in namespace (about 10 s after the
// control plane starts); pods cannot be created before it exists.
func WaitForDefaultServiceAccount(ctx context.Context, admin kubernetes.Interface, namespace string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, startTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := admin.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// startFakeNode starts kube-scheduler and kwok and registers FakeNodeName.
func (cp *ControlPlane) startFakeNode(ctx context.Context, ports []int) error {
	if err := cp.startProcess("kube-scheduler", ports[portScheduler],
		"--kubeconfig="+cp.KubeconfigPath,
		"--authentication-kubeconfig="+cp.KubeconfigPath,
		"--authorization-kubeconfig="+cp.KubeconfigPath,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports[portScheduler]),
		"--leader-elect=false",
		"--v=1",
	); err != nil {
		return err
	}
	if err := cp.waitComponent(ctx, "kube-scheduler"); err != nil {
		return err
	}
	if err := cp.startProcess("kwok", 0,
		"--kubeconfig="+cp.KubeconfigPath,
		"--config="+filepath.Join(cp.opts.BinDir, "..", "stage", "kwok-stages.yaml"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector="+KwokAnnotation+"=fake",
		"--cidr=10.244.0.0/16",
		"--node-ip=127.0.0.1",
		fmt.Sprintf("--server-address=127.0.0.1:%d", ports[portKwok]),
	); err != nil {
		return err
	}
	admin, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		return err
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("10000"), // room for benchmarks' Deployments
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        FakeNodeName,
			Annotations: map[string]string{KwokAnnotation: "fake"},
			Labels:      map[string]string{"type": "kwok", corev1.LabelHostname: FakeNodeName},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("registering fake node: %w", err)
	}
	// kwok marks the node Ready; the scheduler places pods only then.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, startTimeout, true, func(ctx context.Context) (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, FakeNodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("fake node %s not Ready: %w; kwok log:\n%s", FakeNodeName, err, tail(filepath.Join(cp.Dir, "logs", "kwok.log"), 4096))
	}
	// Admission taints a new node not-ready; the node lifecycle controller,
	// which would lift it, is off (one fake node needs no evictions).
	patch := []byte(`{"spec":{"taints":null}}`)
	if _, err := admin.CoreV1().Nodes().Patch(ctx, FakeNodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("removing the not-ready taint of %s: %w", FakeNodeName, err)
	}
	return nil
}

// ExpiredToken returns token, a ServiceAccount token this control plane's
// API server issued, with its validity moved into the past so that it
// expired by ago, and signed again with the cluster's own issuer key: a
// token the API server would accept but for its expiry. TokenRequest cannot
// mint one (it issues tokens valid for at least 10 minutes). Only for a
// ControlPlane this process started (Owned).
func (cp *ControlPlane) ExpiredToken(token string, ago time.Duration) (string, error) {
	if cp.pki == nil {
		return "", errors.New("ExpiredToken needs the issuer key of a control plane this process started")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", err
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", err
	}
	exp := time.Now().Add(-ago)
	claims["exp"], claims["iat"], claims["nbf"] = exp.Unix(), exp.Add(-time.Hour).Unix(), exp.Add(-time.Hour).Unix()
	if payload, err = json.Marshal(claims); err != nil {
		return "", err
	}
	keyPEM, err := os.ReadFile(cp.pki.saPrivate)
	if err != nil {
		return "", err
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return "", errors.New("no PEM block in the issuer key")
	}
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		return "", err
	}
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// PodToken mints a token for ServiceAccount namespace/name bound to the pod
// namespace/pod (which must run as that ServiceAccount) with audiences: the
// API server adds the pod's node to the token and to its TokenReview.
func PodToken(ctx context.Context, admin kubernetes.Interface, namespace, name, pod string, audiences ...string) (string, error) {
	p, err := admin.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:      audiences,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}
	tr, err = admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s bound to pod %s: %w", namespace, name, pod, err)
	}
	return tr.Status.Token, nil
}

// Revoke removes what Grant gave ServiceAccount saNamespace/saName in
// namespace ("" for the cluster-wide grant).
func Revoke(ctx context.Context, admin kubernetes.Interface, saNamespace, saName, namespace string) error {
	name := grantName(saNamespace, saName)
	var err error
	if namespace == "" {
		err = admin.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
	} else {
		err = admin.RbacV1().RoleBindings(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	}
	if err != nil {
		return fmt.Errorf("revoking the grant of %s/%s in %q: %w", saNamespace, saName, namespace, err)
	}
	return nil
}
