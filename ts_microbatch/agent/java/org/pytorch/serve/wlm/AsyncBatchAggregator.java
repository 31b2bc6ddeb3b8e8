package org.pytorch.serve.wlm;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import org.pytorch.serve.job.Job;
import org.pytorch.serve.util.messages.BaseModelRequest;
import org.pytorch.serve.util.messages.ModelInferenceRequest;
import org.pytorch.serve.util.messages.ModelLoadModelRequest;
import org.pytorch.serve.util.messages.ModelWorkerResponse;
import org.pytorch.serve.util.messages.Predictions;
import org.pytorch.serve.util.messages.RequestInput;
import org.pytorch.serve.util.messages.WorkerCommands;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * TorchServe 0.12.0's AsyncBatchAggregator with its job map made safe; loaded in its place by
 * the ts-microbatch agent. Same public and protected API (the rest of the frontend calls it
 * unchanged); each change is marked "Fix:" with the defect it removes.
 */
public class AsyncBatchAggregator extends BatchAggregator {
    /**
     * The jobs sent to the backend and not yet answered, by request id.
     *
     * <p>Fix: a ConcurrentHashMap. The worker thread adds to it (getRequest) while Netty's
     * thread looks answers up in it (sendResponse); 0.12.0's plain LinkedHashMap, read during
     * a resize (which installs the new, empty table before moving the entries), missed jobs:
     * "Unexpected job in sendResponse()", the worker dropped with everything in flight.
     */
    protected Map<String, Job> jobs_in_backend;

    private static final Logger logger = LoggerFactory.getLogger(AsyncBatchAggregator.class);

    /** When each job in the backend was written (or last answered in part), by request id. */
    private final Map<String, Long> sentAt = new ConcurrentHashMap<>();

    /** When the backend last answered anything. */
    private volatile long lastAnswer = System.nanoTime();

    public AsyncBatchAggregator() {
        super();
    }

    public AsyncBatchAggregator(Model model) {
        super(model);
        jobs_in_backend = new ConcurrentHashMap<>();
        // The integration test reads this line to know the replacement, not 0.12.0's class, runs.
        logger.info(
                "ts-microbatch-agent: AsyncBatchAggregator replaced for model {}",
                model.getModelName());
    }

    @Override
    public BaseModelRequest getRequest(String threadName, WorkerState state)
            throws InterruptedException, ExecutionException {
        ModelInferenceRequest req = new ModelInferenceRequest(model.getModelName());
        pollBatch(threadName, state);
        if (model.isUseJobTicket() && jobs.isEmpty()) {
            model.decNumJobTickets();
            return req;
        }
        // Fix: removes through the iterator. 0.12.0 removed from the map it was iterating, a
        // ConcurrentModificationException as soon as a poll returned two jobs (batchSize > 1).
        Iterator<Job> polled = jobs.values().iterator();
        while (polled.hasNext()) {
            Job job = polled.next();
            if (job.isControlCmd()) {
                if (jobs.size() > 1) {
                    throw new IllegalStateException(
                            "Received more than 1 control command. "
                                    + "Control messages should be processed/retrieved one at a time.");
                }
                // Stays in `jobs` until the load's answer clears it (sendResponse).
                String gpu = job.getPayload().getStringParameter("gpu");
                return new ModelLoadModelRequest(model, gpu == null ? -1 : Integer.parseInt(gpu));
            }
            if (job.getCmd() == WorkerCommands.STREAMPREDICT
                    || job.getCmd() == WorkerCommands.STREAMPREDICT2) {
                req.setCommand(job.getCmd());
            }
            req.addRequest(job.getPayload());
            // Put before the request is written: its answer can only come after.
            sentAt.put(job.getJobId(), System.nanoTime());
            jobs_in_backend.put(job.getJobId(), job);
            polled.remove();
        }
        return req;
    }

    /**
     * Answers the jobs a backend message names. Always false, as in 0.12.0: the asynchronous
     * worker thread does not wait for answers.
     */
    @Override
    public boolean sendResponse(ModelWorkerResponse message) {
        if (message.getCode() == 200 && message.getPredictions().isEmpty()) {
            logger.info("Predictions is empty. This is from initial load....");
            jobs.clear(); // the LOAD job getRequest left there
            return true;
        }
        lastAnswer = System.nanoTime();
        for (Predictions prediction : message.getPredictions()) {
            String jobId = prediction.getRequestId();
            Map<String, String> headers = prediction.getHeaders();
            String streamNext = headers == null ? null : headers.get(RequestInput.TS_STREAM_NEXT);
            // Fix: any answer but a stream part that announces more is the job's last, and the
            // job leaves the map. 0.12.0 removed a job only on ts_stream_next "false", so every
            // plain answer stayed for the life of the worker, the request's body with it.
            boolean last = message.getCode() != 200 || !"true".equals(streamNext);
            Job job = last ? jobs_in_backend.remove(jobId) : jobs_in_backend.get(jobId);
            if (last) {
                sentAt.remove(jobId);
            } else if (job != null) {
                sentAt.put(jobId, lastAnswer); // a stream's timeout counts from its last part
            }
            if (job == null) {
                // Fix: logged, not thrown. Thrown from Netty's handler it closed the channel:
                // one answer for a job already gone (failed at a worker restart, answered
                // twice) dropped the worker and every request in flight on it.
                logger.warn("Answer for a job not in the backend, dropped: {}", jobId);
                continue;
            }
            if (job.getPayload().getClientExpireTS() <= System.currentTimeMillis()) {
                logger.warn(
                        "Drop response for inference request {} due to client timeout",
                        job.getPayload().getRequestId());
            } else if (message.getCode() == 200) {
                job.response(
                        prediction.getResp(),
                        prediction.getContentType(),
                        prediction.getStatusCode(),
                        prediction.getReasonPhrase(),
                        headers);
            } else {
                // Fix: an error goes to the jobs its message names. 0.12.0 sent it to every
                // job in the map: the requests still running on the worker, and (kept there
                // forever) every request the worker had ever answered.
                job.sendError(message.getCode(), message.getMessage());
            }
        }
        return false;
    }

    @Override
    public void sendError(BaseModelRequest message, String error, int status) {
        if (message instanceof ModelLoadModelRequest) {
            logger.warn("Load model failed: {}, error: {}", message.getModelName(), error);
            return;
        }
        if (message != null) {
            // The worker died with this request unsent or half sent: its jobs get the error.
            for (RequestInput input : ((ModelInferenceRequest) message).getRequestBatch()) {
                Job job = jobs_in_backend.remove(input.getRequestId());
                if (job == null) {
                    logger.error("Unexpected job in sendError(): {}", input.getRequestId());
                } else {
                    job.sendError(status, error);
                }
            }
            return;
        }
        // No message: the worker is scaled down. As in 0.12.0, control jobs get the error and
        // inference jobs go back to the model's queue for another worker.
        for (Job job : jobs_in_backend.values()) {
            if (jobs_in_backend.remove(job.getJobId()) == null) {
                continue; // answered meanwhile
            }
            if (job.isControlCmd()) {
                job.sendError(status, error);
            } else {
                handleErrorJob(job);
            }
        }
    }

    /**
     * Called by the worker thread when it stops (its only caller here).
     *
     * <p>Fix: the jobs still in the backend get an error. The backend process that held them
     * is gone and the restarted one never heard of them: 0.12.0 left them in the map, their
     * clients waiting until their own timeout.
     */
    @Override
    public void cleanJobs() {
        super.cleanJobs();
        for (Job job : jobs_in_backend.values()) {
            if (jobs_in_backend.remove(job.getJobId()) != null) {
                job.sendError(500, "Worker died.");
            }
        }
    }

    /**
     * Fix: {@code responseTimeout} applies per job, as on the synchronous worker: each job in
     * the backend longer than {@code timeoutMs} without an answer leaves the map (to get 500).
     * 0.12.0's asynchronous worker never read the timeout: a handler that never answered a job
     * (an await that never returns, an encode error outside predict's try) kept its client
     * waiting and its RestJob live for the worker's life. Returns them, for the caller to
     * answer.
     */
    public List<Job> expire(long timeoutMs) {
        long now = System.nanoTime();
        List<Job> expired = new ArrayList<>();
        for (Map.Entry<String, Long> sent : sentAt.entrySet()) {
            String id = sent.getKey();
            if (now - sent.getValue() < timeoutMs * 1_000_000L && jobs_in_backend.containsKey(id)) {
                continue;
            }
            sentAt.remove(id);
            Job job = jobs_in_backend.remove(id); // null: answered or failed meanwhile
            if (job != null) {
                expired.add(job);
            }
        }
        return expired;
    }

    /** Whether the backend has answered nothing for {@code ms} milliseconds. */
    public boolean silentFor(long ms) {
        return System.nanoTime() - lastAnswer >= ms * 1_000_000L;
    }

    @Override
    public void handleErrorJob(Job job) {
        model.addFirst(job);
    }

    /**
     * Fix: the jobs polled into a batch still filling go back to the front of the model's
     * queue, in order, when the worker thread is interrupted (its process died, it is scaled
     * down, its model unregistered), as the synchronous worker's scale-down requeues its jobs.
     * 0.12.0 lost them with this method's local map: in neither {@code jobs} nor
     * {@code jobs_in_backend}, no answer ever ({@code batchSize} 4, {@code maxBatchDelay} 8 s,
     * the worker killed while one request waited: no answer in 45 s).
     */
    @Override
    public void pollBatch(String threadName, WorkerState state)
            throws InterruptedException, ExecutionException {
        Map<String, Job> polled = new LinkedHashMap<>();
        long waitMs = state == WorkerState.WORKER_MODEL_LOADED ? 0 : Long.MAX_VALUE;
        try {
            model.pollBatch(threadName, waitMs, polled);
        } catch (InterruptedException e) {
            List<Job> back = new ArrayList<>(polled.values());
            Collections.reverse(back); // addFirst: the last first, so the first stays first
            for (Job job : back) {
                model.addFirst(job);
            }
            if (!back.isEmpty()) {
                logger.warn("Worker thread interrupted: {} polled jobs requeued", back.size());
            }
            throw e;
        }
        for (Job job : polled.values()) {
            jobs.put(job.getJobId(), job);
            logger.debug("Adding job to jobs: {}", job.getJobId());
        }
    }
}
