package tsmicrobatch.agent;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.lang.instrument.ClassFileTransformer;
import java.lang.instrument.Instrumentation;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.ProtectionDomain;
import java.util.HashMap;
import java.util.Map;

/**
 * Replaces two classes of TorchServe 0.12.0's frontend, AsyncBatchAggregator and
 * AsyncWorkerThread (the frontend's side of asyncCommunication: true), with the fixed ones
 * compiled from org/pytorch/serve/wlm/ beside this file. README.md says what they fix.
 *
 * <p>Enabled with one line in config.properties: vmargs=-javaagent:/path/to/the.jar
 *
 * <p>It replaces a class only when the bytes the JVM is about to load are exactly TorchServe
 * 0.12.0's (SHA-256 below): a replacement compiled against another version's fields and
 * methods could fail at run time in ways far from here. Both are checked in premain, before
 * anything is installed, so that either both are replaced or neither. Another agent listed
 * first may change the bytes the JVM loads: the first of the two classes loaded decides for
 * both (a class file changed since premain means neither is replaced; unchanged means both
 * are, the second over what that agent changed in it, since its original on the class path
 * is 0.12.0's), so they never run half replaced, where requests in flight at a worker death
 * timed out. Every decision is one line on stderr, which TorchServe's frontend writes to its
 * console output.
 */
public final class Agent implements ClassFileTransformer {
    static final String TAG = "ts-microbatch-agent: ";

    /** Internal class name -> SHA-256 of its class file in TorchServe 0.12.0's model-server.jar. */
    private static final Map<String, String> ORIGINALS = new HashMap<>();

    static {
        ORIGINALS.put(
                "org/pytorch/serve/wlm/AsyncBatchAggregator",
                "aed0a24091f876e16c3138c335df25fca0380fb704212bc3b53f004c78111cf4");
        ORIGINALS.put(
                "org/pytorch/serve/wlm/AsyncWorkerThread",
                "c64c9e4e6c0edab0890c34d86e5250703f8a6fc2cd53d99a6e2f845a1ac1e4e5");
    }

    /**
     * Where the jar keeps the replacements: not at their class path, so that the JVM never
     * loads them by name from this jar (the system class path lists it after TorchServe's).
     */
    private static final String REPLACEMENTS = "/tsmicrobatch/agent/replacements/";

    private final Map<String, byte[]> replacements;

    /** Whether both classes are replaced, decided by the first loaded; null before. */
    private Boolean both;

    private Agent(Map<String, byte[]> replacements) {
        this.replacements = replacements;
    }

    public static void premain(String args, Instrumentation inst) {
        Map<String, byte[]> replacements = new HashMap<>();
        ClassLoader system = ClassLoader.getSystemClassLoader();
        for (Map.Entry<String, String> original : ORIGINALS.entrySet()) {
            String name = original.getKey();
            byte[] bytes = read(system.getResourceAsStream(name + ".class"));
            if (bytes == null) {
                refuse(name.replace('/', '.') + " is not on the class path (not TorchServe?)");
                return;
            }
            String digest = sha256(bytes);
            if (!digest.equals(original.getValue())) {
                refuse(mismatch(name, digest));
                return;
            }
            String simple = name.substring(name.lastIndexOf('/') + 1);
            byte[] replacement = read(Agent.class.getResourceAsStream(REPLACEMENTS + simple));
            if (replacement == null) {
                refuse("the agent jar lacks its replacement for " + simple + " (a broken build)");
                return;
            }
            replacements.put(name, replacement);
        }
        inst.addTransformer(new Agent(replacements));
        System.err.println(
                TAG
                        + "installed: TorchServe 0.12.0's AsyncBatchAggregator and "
                        + "AsyncWorkerThread will be replaced when loaded");
    }

    @Override
    public byte[] transform(
            ClassLoader loader,
            String className,
            Class<?> classBeingRedefined,
            ProtectionDomain domain,
            byte[] classfileBuffer) {
        byte[] replacement = className == null ? null : replacements.get(className);
        if (replacement == null || classBeingRedefined != null) {
            return null; // not ours, or a redefinition: leave it alone
        }
        String name = className.replace('/', '.');
        String digest = sha256(classfileBuffer);
        boolean unchanged = digest.equals(ORIGINALS.get(className));
        synchronized (this) {
            if (both == null) { // the first of the two: it decides for both
                both = unchanged;
                if (!unchanged) {
                    refuse(mismatch(className, digest) + ", so neither class is replaced");
                    return null;
                }
            } else if (!both) {
                refuse(name + ": the other class was left unchanged, so this one is too");
                return null;
            }
        }
        if (unchanged) {
            System.err.println(TAG + "patched " + name + " (TorchServe 0.12.0)");
        } else {
            System.err.println(
                    TAG
                            + "patched "
                            + name
                            + " (TorchServe 0.12.0 on the class path) over another agent's"
                            + " change to it: the other class was replaced, both or neither");
        }
        return replacement.clone();
    }

    private static String mismatch(String name, String digest) {
        return name.replace('/', '.')
                + " is not TorchServe 0.12.0's (SHA-256 "
                + digest
                + ", expected "
                + ORIGINALS.get(name)
                + ")";
    }

    private static void refuse(String why) {
        System.err.println(TAG + "not patching: " + why + "; TorchServe runs unchanged");
    }

    private static byte[] read(InputStream in) {
        if (in == null) {
            return null;
        }
        try (InputStream stream = in) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] buffer = new byte[8192];
            for (int n; (n = stream.read(buffer)) > 0; ) {
                out.write(buffer, 0, n);
            }
            return out.toByteArray();
        } catch (IOException e) {
            return null;
        }
    }

    static String sha256(byte[] bytes) {
        try {
            StringBuilder hex = new StringBuilder();
            for (byte b : MessageDigest.getInstance("SHA-256").digest(bytes)) {
                hex.append(String.format("%02x", b));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
    }
}
